"""Run on a GPU machine under compute-sanitizer: out-of-range Gather indices must make no
out-of-bounds access (the kernels clamp), only a report.

    python3 tests/memcheck_gather.py build DIR    # builds the model (no sanitizer needed)
    compute-sanitizer --error-exitcode 9 python3 tests/memcheck_gather.py run DIR
"""
import sys

import numpy as np


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("build", "run"):
        sys.exit(__doc__)
    stage, workdir = sys.argv[1], sys.argv[2]
    import byoc
    if stage == "build":
        from test_runtime_cuda import embedding_model
        model, _ = embedding_model()
        byoc.build(model, target="cuda -arch=sm_90", config={"backends": ["builtin"], "cuda_graph": True},
                   workdir=workdir)
        return
    import cupy
    module = byoc.load(f"{workdir}/model.so")
    reported = 0
    for bad in (-2**31, -501, 500, 2**31 - 1, 2**62, -2**62):
        ids = np.arange(8, dtype=np.int64)
        ids[5] = bad
        for _ in range(3):
            module.run(cupy.asarray(ids))
            try:
                module.synchronize()
            except byoc.RuntimeError:
                reported += 1
    print(f"memcheck_gather: {reported} of 18 runs reported out-of-range indices")
    sys.exit(0 if reported == 18 else 1)


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    main()
