"""API misuse scenarios about a library's life: close, garbage collection, files removed
or replaced after load, benchmark(), load()/metadata_of() of paths that are no library,
weights_path=, and what only the cuda target has (streams, torch, host arrays)."""
from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import numpy as np

from .api_arrays import _run_out
from .api_context import ALL_KINDS, BOTH, CPU, CUDA, Wrong, _first_name, scenario
from .runner import case_dir


# ---- lifecycle ------------------------------------------------------------------------

# ---- positive controls: valid use, which must answer right ----

@scenario("valid: run", kinds=ALL_KINDS, group="control", expect="accept")
def _valid_run(ctx):
    ctx.check(ctx.module.run(**ctx.good_inputs()))


@scenario("valid: run with out=", kinds=ALL_KINDS, group="control", expect="accept")
def _valid_out(ctx):
    out = [ctx.array(np.zeros_like(e)) for e in ctx.expected]
    ctx.module.run(**ctx.good_inputs(), out=out)
    ctx.check(out)


@scenario("valid: two modules of one library", kinds=ALL_KINDS, group="control", expect="accept")
def _valid_two_modules(ctx):
    other = ctx.load()
    ctx.check(other.run(**ctx.good_inputs()))
    ctx.check(ctx.module.run(**ctx.good_inputs()))
    other.close()


@scenario("valid: load again after close", kinds=ALL_KINDS, group="control", expect="accept")
def _valid_reload(ctx):
    ctx.module.close()
    again = ctx.load()
    ctx.check(again.run(**ctx.good_inputs()))
    again.close()
    ctx.module_closed_on_purpose = True


@scenario("run after close", kinds=ALL_KINDS, group="lifecycle")
def _run_after_close(ctx):
    ctx.module.close()
    ctx.module_closed_on_purpose = True
    ctx.module.run(**ctx.good_inputs())


@scenario("close twice", kinds=ALL_KINDS, group="lifecycle")
def _close_twice(ctx):
    ctx.module.close()
    ctx.module.close()
    ctx.module_closed_on_purpose = True


@scenario("run with out= after close", group="lifecycle")
def _out_after_close(ctx):
    out = [ctx.array(np.zeros_like(e)) for e in ctx.expected]
    ctx.module.close()
    ctx.module_closed_on_purpose = True
    ctx.module.run(**ctx.good_inputs(), out=out)


@scenario("benchmark after close", group="lifecycle")
def _benchmark_after_close(ctx):
    ctx.module.close()
    ctx.module_closed_on_purpose = True
    ctx.module.benchmark(**ctx.good_inputs(), repeat=1, warmup=0)


@scenario("metadata after close", group="lifecycle")
def _metadata_after_close(ctx):
    ctx.module.close()
    ctx.module_closed_on_purpose = True
    if ctx.module.metadata["inputs"][0]["name"] != "x":
        raise Wrong("metadata changed after close")


@scenario("garbage-collected module, then load again", kinds=ALL_KINDS, group="lifecycle")
def _gc_reload(ctx):
    module = ctx.load()
    del module
    gc.collect()
    ctx.check(ctx.load().run(**ctx.good_inputs()))


@scenario("three modules of one path", kinds=ALL_KINDS, group="lifecycle")
def _three(ctx):
    modules = [ctx.load() for _ in range(3)]
    for module in modules:
        ctx.check(module.run(**ctx.good_inputs()))
    modules[1].close()
    ctx.check(modules[0].run(**ctx.good_inputs()))
    ctx.check(modules[2].run(**ctx.good_inputs()))


@scenario("file removed after load", kinds=ALL_KINDS, group="lifecycle")
def _unlinked(ctx):
    copy = ctx.copy_library()
    module = ctx.load(copy, **({"weights_path": copy.with_suffix(".safetensors")} if ctx.kind == "sidecar" else {}))
    copy.unlink()
    ctx.check(module.run(**ctx.good_inputs()))


@scenario("file replaced by another model after load", group="lifecycle")
def _replaced(ctx):
    copy = ctx.copy_library()
    first = ctx.load(copy)
    shutil.copyfile(ctx.library["siblings"]["multi"], case_dir() / "tmp.so")
    os.replace(case_dir() / "tmp.so", copy)
    second = ctx.load(copy)
    if second.input_names != ["a", "b", "idx"]:
        raise Wrong(f"loading a rebuilt file at the same path gave the old library (inputs {second.input_names})")
    ctx.check(first.run(**ctx.good_inputs()), what="the first module after its file was replaced")


@scenario("benchmark arguments", group="lifecycle")
def _benchmark_bad(ctx):
    ctx.module.benchmark(**ctx.good_inputs(), repeat=0)


@scenario("benchmark repeat as string", group="lifecycle")
def _benchmark_string(ctx):
    ctx.module.benchmark(**ctx.good_inputs(), repeat="3")


@scenario("benchmark ok", group="lifecycle")
def _benchmark_ok(ctx):
    milliseconds = ctx.module.benchmark(**ctx.good_inputs(), repeat=2, warmup=1)
    if not (isinstance(milliseconds, float) and milliseconds >= 0):
        raise Wrong(f"benchmark() returned {milliseconds!r}")


# ---- load() and metadata_of() on bad paths -------------------------------------------------

def _bad_path(kind: str, ctx) -> object:
    folder = case_dir()
    if kind == "None":
        return None
    if kind == "int":
        return 42
    if kind == "bytes path":
        return os.fsencode(ctx.path)
    if kind == "empty string":
        return ""
    if kind == "missing":
        return str(folder / "missing.so")
    if kind == "directory":
        return str(folder)
    if kind == "directory with slash":
        return str(folder) + "/"
    if kind == "fifo":
        os.mkfifo(folder / "fifo.so")
        return str(folder / "fifo.so")
    if kind == "symlink loop":
        os.symlink(folder / "b.so", folder / "a.so")
        os.symlink(folder / "a.so", folder / "b.so")
        return str(folder / "a.so")
    if kind == "dangling symlink":
        os.symlink(folder / "nowhere.so", folder / "dangling.so")
        return str(folder / "dangling.so")
    if kind == "text file":
        (folder / "text.so").write_text("not a library\n")
        return str(folder / "text.so")
    if kind == "empty file":
        (folder / "empty.so").write_bytes(b"")
        return str(folder / "empty.so")
    if kind == "/dev/null":
        return "/dev/null"
    if kind == "/dev/zero":
        return "/dev/zero"
    if kind == "NUL in path":
        return ctx.path + "\0.so"
    if kind == "very long path":
        return "/" + "a" * 5000 + ".so"
    if kind == "libm":  # a real shared library that is not byoc's
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "/libm" in line and ".so" in line]
        return paths[0] if paths else "/lib/x86_64-linux-gnu/libm.so.6"
    if kind == "python extension":
        return np._core._multiarray_umath.__file__ if hasattr(np, "_core") else np.core._multiarray_umath.__file__
    if kind == "relative path":
        shutil.copyfile(ctx.path, folder / "relative.so")
        return "relative.so"
    if kind == "unicode and newline in name":
        target = folder / "mödel\n名前.so"
        shutil.copyfile(ctx.path, target)
        return str(target)
    if kind == "pathlib":
        return Path(ctx.path)
    if kind == "PathLike":
        class _PathLike(os.PathLike):
            def __fspath__(self):
                return ctx.path
        return _PathLike()
    raise AssertionError(kind)


_LOADABLE = ("relative path", "unicode and newline in name", "pathlib", "PathLike")
_BAD_PATHS = ("None", "int", "bytes path", "empty string", "missing", "directory", "directory with slash", "fifo",
              "symlink loop", "dangling symlink", "text file", "empty file", "/dev/null", "/dev/zero", "NUL in path",
              "very long path", "libm", "python extension") + _LOADABLE

for _kind in _BAD_PATHS:
    def _load_scenario(ctx, kind=_kind):
        import byoc
        path = _bad_path(kind, ctx)
        module = byoc.load(path)
        if kind not in _LOADABLE:
            raise Wrong(f"byoc.load accepted {kind}: {module!r}")
        ctx.check(module.run(**ctx.good_inputs()))

    def _metadata_scenario(ctx, kind=_kind):
        import byoc
        metadata = byoc.runtime.metadata_of(_bad_path(kind, ctx))
        if kind not in _LOADABLE:
            raise Wrong(f"metadata_of accepted {kind}")
        if metadata["inputs"][0]["name"] != "x":
            raise Wrong(f"metadata_of returned {metadata!r:.80}")
    scenario(f"load {_kind}", kinds=("mlp",), devices=CPU if _kind not in ("fifo", "missing") else BOTH)(_load_scenario)
    if _kind not in _LOADABLE[:2]:
        scenario(f"metadata_of {_kind}", kinds=("mlp",), devices=CPU)(_metadata_scenario)


# ---- weights_path= ----------------------------------------------------------------------

def _weights_value(kind: str, ctx):
    folder = case_dir()
    if kind == "fifo":
        os.mkfifo(folder / "weights.safetensors")
        return str(folder / "weights.safetensors")
    if kind == "directory":
        return str(folder)
    if kind == "missing":
        return str(folder / "missing.safetensors")
    if kind == "empty file":
        (folder / "empty.safetensors").write_bytes(b"")
        return str(folder / "empty.safetensors")
    if kind == "the library itself":
        return ctx.path
    if kind == "symlink loop":
        os.symlink(folder / "b.safetensors", folder / "a.safetensors")
        os.symlink(folder / "a.safetensors", folder / "b.safetensors")
        return str(folder / "a.safetensors")
    if kind == "int":
        return 42
    if kind == "bytes":
        return os.fsencode(ctx.library.get("sidecar", ctx.path))
    if kind == "NUL in path":
        return ctx.library.get("sidecar", ctx.path) + "\0"
    if kind == "pathlib":
        return Path(ctx.library.get("sidecar", ctx.path))
    if kind == "/dev/zero":
        return "/dev/zero"
    raise AssertionError(kind)


_WEIGHTS = ("fifo", "directory", "missing", "empty file", "the library itself", "symlink loop", "int", "bytes",
            "NUL in path", "pathlib", "/dev/zero")

for _kind in _WEIGHTS:
    def _weights_scenario(ctx, kind=_kind):
        module = ctx.load(weights_path=_weights_value(kind, ctx))
        if ctx.kind != "sidecar" or kind not in ("pathlib",):
            raise Wrong(f"load() accepted weights_path {kind} for a library with "
                        f"{'a sidecar' if ctx.kind == 'sidecar' else 'embedded weights'}")
        ctx.check(module.run(**ctx.good_inputs()))
    scenario(f"weights_path {_kind}", kinds=("mlp", "sidecar"),
             devices=BOTH if _kind in ("fifo", "missing") else CPU)(_weights_scenario)


@scenario("sidecar missing next to the library", kinds=("sidecar",), group="weights_path")
def _sidecar_missing(ctx):
    copy = case_dir() / "alone.so"
    shutil.copyfile(ctx.path, copy)
    ctx.load(copy, weights_path=None)
    raise Wrong("loaded a sidecar library without its .safetensors")


@scenario("sidecar found next to the library", kinds=("sidecar",), group="weights_path")
def _sidecar_beside(ctx):
    copy = ctx.copy_library()
    import byoc
    ctx.check(byoc.load(copy).run(**ctx.good_inputs()))


@scenario("sidecar of another program", kinds=("sidecar",), group="weights_path")
def _sidecar_other(ctx):
    """A .safetensors whose program id differs (the header's id edited, same length): the
    weights of another model, or of this one built another way."""
    data = bytearray(Path(ctx.library["sidecar"]).read_bytes())
    program_id = ctx.library["metadata"]["program_id"].encode()
    position = data.find(program_id)
    data[position:position + len(program_id)] = bytes(reversed(program_id))
    other = case_dir() / "other.safetensors"
    other.write_bytes(bytes(data))
    ctx.load(weights_path=other)
    raise Wrong("loaded weights of another program")


@scenario("sidecar checksum edited", kinds=("sidecar",), group="weights_path")
def _sidecar_checksum(ctx):
    """A .safetensors whose header's checksum is changed (same length): the bytes no longer match it."""
    data = bytearray(Path(ctx.library["sidecar"]).read_bytes())
    position = data.find(b'"checksum":"') + len(b'"checksum":"')
    data[position] = ord("1") if data[position] != ord("1") else ord("2")
    other = case_dir() / "checksum.safetensors"
    other.write_bytes(bytes(data))
    ctx.load(weights_path=other)
    raise Wrong("loaded weights whose checksum does not match")


# ---- cuda only ---------------------------------------------------------------------------

@scenario("numpy input to a cuda module", kinds=("mlp", "multi"), devices=CUDA, group="cuda")
def _numpy_on_cuda(ctx):
    inputs = ctx.good_inputs()
    inputs[_first_name(ctx)] = ctx.inputs[_first_name(ctx)]
    ctx.check(ctx.module.run(**inputs), what="outputs for a host input")


@scenario("numpy out= for a cuda module", kinds=("mlp",), devices=CUDA, group="cuda")
def _numpy_out_on_cuda(ctx):
    _run_out(ctx, [np.zeros_like(e) for e in ctx.expected])


for _label in ("a new non-blocking stream", "the null stream", "a stream as int", "the per-thread stream"):
    def _cuda_stream_scenario(ctx, label=_label):
        import cupy
        owned = cupy.cuda.Stream(non_blocking=True)  # alive until the end of the case
        stream = {"a new non-blocking stream": owned, "the null stream": cupy.cuda.Stream.null,
                  "a stream as int": owned.ptr,
                  "the per-thread stream": getattr(cupy.cuda.Stream, "ptds", cupy.cuda.Stream.null)}[label]
        outputs = ctx.module.run(**ctx.good_inputs(), stream=stream)
        owned.synchronize()
        ctx.synchronize()
        ctx.check(outputs)
    scenario(f"stream= {_label}", kinds=("mlp", "multi"), devices=CUDA, group="cuda")(_cuda_stream_scenario)


@scenario("stream= a string on cuda", devices=CUDA, group="cuda")
def _cuda_stream_string(ctx):
    ctx.check(ctx.module.run(**ctx.good_inputs(), stream="stream"))


@scenario("torch tensors", kinds=("mlp", "multi"), devices=CUDA, group="cuda")
def _torch(ctx):
    import torch
    inputs = {k: torch.as_tensor(v, device="cuda") for k, v in ctx.inputs.items()}
    ctx.check(ctx.module.run(**inputs))


@scenario("torch non-contiguous", kinds=("mlp",), devices=CUDA, group="cuda")
def _torch_strided(ctx):
    import torch
    x = torch.as_tensor(ctx.inputs["x"], device="cuda").t().contiguous().t()
    ctx.check(ctx.module.run(x=x), what="outputs for a transposed torch view")


@scenario("torch cpu tensor to a cuda module", kinds=("mlp",), devices=CUDA, group="cuda")
def _torch_cpu(ctx):
    import torch
    ctx.check(ctx.module.run(x=torch.as_tensor(ctx.inputs["x"])), what="outputs for a torch cpu tensor")
