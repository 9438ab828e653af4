"""Every run of a built model against onnxruntime, not only the first: the first run executes
the calls, the second captures CUDA graphs, the rest replay them, and out= runs write a
caller's buffer. A library whose replays go wrong (ResNet-50 under `default` on an H200,
2026-11-28: right on run 1, 1.8e-1 off after) shows it here run by run, with and without
CUDA graphs.

    python3 bench/replay_check.py --case resnet50:32 --config default
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from real_model_zoo import Wrapper, model_spec  # noqa: E402

START = time.time()


def log(*parts):
    print(f"[{time.time() - START:6.1f}s]", *parts, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", default="resnet50:32", help="model:batch (bench/real_model_zoo.py)")
    parser.add_argument("--config", default="default", help="a build config name or YAML path")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--workdir", default="/tmp/byoc-replay-check")
    args = parser.parse_args()
    import onnxruntime as ort

    import byoc
    from byoc.config import load_config
    name, batch = args.case.split(":")
    make, inputs_of, attribute = model_spec(name)
    first_inputs = inputs_of(int(batch), False, torch.Generator().manual_seed(0))
    wrapper = Wrapper(make("eager", False).eval(), list(first_inputs), attribute).eval()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    onnx_path = workdir / f"{name}_b{batch}.onnx"
    torch.onnx.export(wrapper, tuple(first_inputs.values()), str(onnx_path), input_names=list(first_inputs),
                      opset_version=17, dynamo=False)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    log("exported", onnx_path)
    failed = False
    for graphs in (True, False):
        config = load_config(args.config)
        config.cuda_graph = graphs
        library = byoc.build(str(onnx_path), config=config, workdir=str(workdir / f"graphs_{graphs}"))
        module = library.load()
        log(f"cuda_graph {graphs}: built, backends {library.metadata.get('backends')}")
        errors, previous = [], None
        for run in range(args.runs):
            # new inputs each run: a run that reads what an earlier one left is seen
            inputs = inputs_of(int(batch), False, torch.Generator().manual_seed(run))
            want = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
            feeds = {k: v.cuda() for k, v in inputs.items()}
            if run % 2:
                got = torch.empty_like(previous)
                module.run(**feeds, out=[got])
            else:
                got = module.run(**feeds)
            previous = got
            got = got.float().cpu().numpy()
            errors.append(float(np.abs(got - want).max() / np.abs(want).max()))
        log(f"cuda_graph {graphs}: relative error per run (odd runs out=):", " ".join(f"{e:.1e}" for e in errors))
        failed |= max(errors) > 2e-2
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
