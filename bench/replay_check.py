"""Every run of a built model against onnxruntime, not only the first: the first run executes
the calls, the second captures CUDA graphs, the rest replay them, and out= runs write a
caller's buffer. A library whose later runs go wrong (ResNet-50 b32 under `default` on an
H200, 2026-11-28: right on run 1, 1.4e-1 to 1.9e-1 off after, with CUDA graphs and without)
shows it here run by run (that one was a cuDNN kernel launched early, now fenced:
bench/results/resnet50_default_later_runs_h200.md). The options narrow it down: --backends
(which backend), --output (up to which tensor), --library (an earlier build, e.g. under
compute-sanitizer), --instances (state of one model instance or shared), --stream (the
caller's stream or one of each run's own).

    python3 bench/replay_check.py --case resnet50:32 --config default
    python3 bench/replay_check.py --case resnet50:32 --backends cudnn --graphs off --output layer3
"""
import argparse
import contextlib
import json
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
    parser.add_argument("--backends", default=None,
                        help="comma-separated backends instead of the config's (to find the one at fault; "
                             "'none': builtin alone)")
    parser.add_argument("--graphs", choices=("both", "on", "off"), default="both")
    parser.add_argument("--target", default=None, help="the config's target instead, e.g. 'cuda -arch=sm_90 -pdl=0'")
    parser.add_argument("--library", default=None,
                        help="run this library (built by an earlier call with the same --case, --output and "
                             "--workdir) "
                             "instead of building: e.g. under compute-sanitizer, which would slow a build's "
                             "timing to a crawl")
    parser.add_argument("--output", default=None,
                        help="check the model only up to the last tensor whose name contains this (e.g. layer2): "
                             "where a long model goes wrong")
    parser.add_argument("--instances", type=int, default=1,
                        help="model instances of the library, all alive, run i on instance i mod N: a wrong "
                             "run on a fresh instance means state shared across instances (a library's), not one "
                             "instance's")
    parser.add_argument("--stream", choices=("current", "new"), default="current",
                        help="new: every run (its inputs and outputs too) on a torch stream of its own")
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
    if not (args.library and onnx_path.is_file()):
        torch.onnx.export(wrapper, tuple(first_inputs.values()), str(onnx_path), input_names=list(first_inputs),
                          opset_version=17, dynamo=False)
    if args.output:
        import onnx
        import onnx.utils
        graph = onnx.load(str(onnx_path)).graph
        named = [out for node in graph.node for out in node.output if args.output in out]
        if not named:
            raise SystemExit(f"no tensor of {onnx_path.name} has {args.output!r} in its name")
        cut_path = workdir / f"{name}_b{batch}_to_{named[-1].strip('/').replace('/', '_')}.onnx"
        onnx.utils.extract_model(str(onnx_path), str(cut_path), [i.name for i in graph.input
                                 if i.name in first_inputs], [named[-1]])
        onnx_path = cut_path
        log("cut after", named[-1])
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    log("exported", onnx_path)
    failed = False
    overrides = {"target": args.target} if args.target else {}
    if args.backends:  # names, or a config's backends list as JSON ('[{"cudnn": {"plan": "heuristic"}}]')
        try:
            overrides["backends"] = [] if args.backends == "none" else \
                json.loads(args.backends) if args.backends.startswith("[") else args.backends.split(",")
        except json.JSONDecodeError as error:
            parser.error(f"--backends {args.backends!r}: not a JSON list ({error})")
    # a given library runs once, as it was built
    modes = (None,) if args.library else {"both": (True, False), "on": (True,), "off": (False,)}[args.graphs]
    for graphs in modes:
        if args.library:
            path = args.library
            graphs = byoc.runtime.metadata_of(path).get("cuda_graph")
            log(f"loading {args.library}")
        else:
            config = load_config(args.config, overrides=overrides)
            config.cuda_graph = graphs
            library = byoc.build(str(onnx_path), config=config, workdir=str(workdir / f"{onnx_path.stem}_graphs_{graphs}"))
            path = library.path
            log(f"cuda_graph {graphs}: built {library.path}, backends {library.metadata.get('backends')}")
        modules = [byoc.load(path) for _ in range(max(1, args.instances))]
        errors, stale, previous, wants = [], [], None, []
        # new inputs each run (a run that reads what an earlier one left is seen), then the
        # first run's inputs again (a run that changed the weights or other state is seen)
        for index, run in enumerate(list(range(args.runs)) + [0]):
            module = modules[index % len(modules)]
            context = torch.cuda.stream(torch.cuda.Stream()) if args.stream == "new" else contextlib.nullcontext()
            context.__enter__()
            inputs = inputs_of(int(batch), False, torch.Generator().manual_seed(run))
            want = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
            wants.append(want)
            feeds = {k: v.cuda() for k, v in inputs.items()}
            if run % 2:
                got = torch.empty_like(previous)
                module.run(**feeds, out=[got])
            else:
                got = module.run(**feeds)
            previous = got
            got = got.float().cpu().numpy()
            context.__exit__(None, None, None)
            errors.append(float(np.abs(got - want).max() / np.abs(want).max()))
            if len(wants) > 1:  # against the run before's answer: an output that did not change
                stale.append(float(np.abs(got - wants[-2]).max() / np.abs(wants[-2]).max()))
        log(f"cuda_graph {graphs}: relative error per run (odd runs out=; the last: run 0's inputs again):",
            " ".join(f"{e:.1e}" for e in errors))
        log(f"cuda_graph {graphs}: against the run before's answer:", " ".join(f"{e:.1e}" for e in stale))
        failed |= max(errors) > 2e-2
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
