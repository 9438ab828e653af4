"""`byoc run`: an ONNX model with the reference interpreter, or a built .so on its device
(latency percentiles, the error against expected outputs)."""
from __future__ import annotations

import argparse

from ..user_text import printable
from .common import (EXIT_OK, UsageError, add_input_shape_option, check_arrays_fit, count_argument, model_interface,
                     parse_dims, parse_input_shapes)


def run_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("model", help="an ONNX model file (run by the reference interpreter) or a built .so")
    parser.add_argument("--inputs", required=True, metavar="INPUTS.npz",
                        help="one array per model input, named after it (an 'in_' prefix, "
                             "as the test fixtures use, is accepted)")
    add_input_shape_option(parser)
    parser.add_argument("--save", metavar="OUT.npz", help="save the outputs, named after the model's outputs")
    parser.add_argument("--repeat", type=count_argument, default=100, metavar="N",
                        help="a built library: time N runs, each waited for, and print latency percentiles "
                             "(default 100)")
    parser.add_argument("--weights", metavar="W.safetensors",
                        help="a built library: run with this weights file (its sidecar elsewhere, or one "
                             "`byoc refit` wrote)")


def _load_input_arrays(path: str) -> dict:
    import zipfile

    import numpy as np

    import os
    import stat
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        mode = None  # missing or unreadable: np.load's own OSError says which
    if mode is not None and not stat.S_ISREG(mode):
        # a FIFO would block np.load forever, a device read without end
        raise UsageError(f"--inputs {path!r} is not a regular file; expected an .npz archive")
    try:
        archive = np.load(path, allow_pickle=False)
        if isinstance(archive, np.ndarray):  # np.load reads a .npy file as one bare array
            raise UsageError(f"--inputs {path!r} is a single .npy array; expected an .npz archive with one "
                             f"array per model input, named after it (np.savez(path, x=...))")
        with archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, zipfile.BadZipFile) as error:  # OSError (missing file) passes through
        raise UsageError(f"--inputs {path!r} is not a readable .npz file: {error}") from None
    prefixed = {key[len("in_"):]: value for key, value in arrays.items() if key.startswith("in_")}
    return prefixed or arrays


def _load_expected_arrays(path: str) -> dict:
    """The expected outputs an .npz may carry beside the inputs ('out_<name>', as the test
    fixtures do); empty when it has none. Read after _load_input_arrays accepted the file."""
    import numpy as np
    with np.load(path, allow_pickle=False) as archive:
        return {key[len("out_"):]: archive[key] for key in archive.files if key.startswith("out_")}


def _compare_line(name: str, got, want) -> str:
    """How far one output is from the expected array, in the terms tolerances use."""
    import numpy as np
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)}, but the expected array is {tuple(want.shape)}"
    difference = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))) if got.size else 0.0
    scale = np.max(np.abs(want.astype(np.float64))) if want.size else 0.0
    relative = difference / scale if scale else difference
    return f"{name}: max |got - expected| {difference:.3g}, relative to max |expected| {relative:.3g}"


def run_command(args: argparse.Namespace) -> int:
    import numpy as np

    from ..frontend import from_onnx
    from ..interpreter import interpret

    arrays = _load_input_arrays(args.inputs)
    if args.model.endswith(".so"):
        if args.input_shape or args.dim:  # a built library's shapes were fixed at build time
            raise UsageError(f"--input-shape and --dim are for an .onnx model; {args.model!r} is a built library "
                             f"whose input shapes were fixed when it was built")
        return _run_library(args, arrays)
    if args.weights:
        raise UsageError(f"--weights is for a built library; {args.model!r} is an ONNX model (its weights are in it)")
    interface = model_interface(args.model)
    input_names = [entry["name"] for entry in interface["inputs"]] if interface else None
    output_names = [entry["name"] for entry in interface["outputs"]] if interface else None
    shapes = parse_input_shapes(args.input_shape)
    if input_names is not None:
        missing = [name for name in input_names if name not in arrays]
        unknown = sorted(set(arrays) - set(input_names))
        if missing or unknown:
            raise UsageError(f"--inputs {args.inputs!r} must hold one array per model input "
                             f"({', '.join(input_names)}); missing: {missing or 'none'}, "
                             f"not inputs: {unknown or 'none'}")
        # the arrays fix dynamic dims; an explicit --input-shape wins (and is checked below)
        check_arrays_fit(args.inputs, {entry["name"]: entry["dims"] for entry in interface["inputs"]},
                          {name: arrays[name] for name in input_names if name not in shapes})
        shapes = {**{name: arrays[name].shape for name in input_names}, **shapes}

    mod = from_onnx(args.model, input_shapes=shapes, dims=parse_dims(args.dim))
    if input_names is not None:
        results = interpret(mod, *[arrays[name] for name in input_names])  # params follow graph inputs
    else:
        results = interpret(mod, **arrays)
    results = list(results) if isinstance(results, tuple) else [results]
    output_names = output_names or [f"output_{i}" for i in range(len(results))]

    for name, value in zip(output_names, results):
        value = np.asarray(value)
        first = np.array2string(value.reshape(-1)[:6], precision=5, separator=", ")
        print(f"{printable(name)}: {value.dtype} {tuple(value.shape)}  first values {first}")
    if args.save:
        _save_outputs(args.save, {name: np.asarray(value) for name, value in zip(output_names, results)})
    return EXIT_OK


def _save_outputs(path: str, arrays: dict):
    import numpy as np

    np.savez(path, **arrays)
    # np.savez appends .npz to a name without it: report the file it wrote
    print(f"wrote {path if path.endswith('.npz') else path + '.npz'}")


def _run_library(args: argparse.Namespace, arrays: dict) -> int:
    """Run a built library (on its device: CuPy arrays for cuda) and print its outputs."""
    import numpy as np

    from ..runtime import load
    module = load(args.model, weights_path=args.weights)
    if module.device == "cuda":
        import cupy
        arrays = {name: cupy.asarray(value) for name, value in arrays.items()}
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: expected a number of runs >= 1")
    results = module.run(**arrays)
    times = np.sort(np.asarray(module.latencies(**arrays, repeat=args.repeat, warmup=min(10, args.repeat))))
    results = list(results) if isinstance(results, tuple) else [results]
    results = [np.asarray(r.get() if hasattr(r, "get") else r) for r in results]
    p50, p90, p99 = (float(np.percentile(times, q)) for q in (50, 90, 99))
    print(printable(f"{args.model}: {module.metadata['target']}, backends {', '.join(module.metadata['backends'])}; "
                    f"latency over {len(times)} runs: p50 {p50:.3f} ms, p90 {p90:.3f} ms, p99 {p99:.3f} ms, "
                    f"mean {float(times.mean()):.3f} ms"))
    for name, value in zip(module.output_names, results):
        first = np.array2string(value.reshape(-1)[:6], precision=5, separator=", ")
        print(f"{printable(name)}: {value.dtype} {tuple(value.shape)}  first values {first}")
    expected = _load_expected_arrays(args.inputs)
    for name, value in zip(module.output_names, results):
        if name in expected:
            print(_compare_line(printable(name), value, expected[name]))
    if args.save:
        _save_outputs(args.save, dict(zip(module.output_names, results)))
    return EXIT_OK


# ---- the table and the driver ------------------------------------------------------------
