"""API misuse scenarios about the arrays given to Module.run: dtypes, shapes, layouts,
objects that are no arrays, broken __array_interface__s, which inputs, run-time data
(Gather indices), out= and stream=."""
from __future__ import annotations

import ctypes

import numpy as np

from . import libraries
from .api_context import BOTH, CPU, Wrong, _first_name, _run_with_first, scenario
from .runner import case_dir


# ---- dtypes -------------------------------------------------------------------------

_DTYPES = ["float64", "float16", "int32", "int64", "int8", "uint8", "bool", "uint16", "uint32", "complex64",
           "object", "<U3", "S3", "datetime64[s]", ">f4", "V4", "bfloat16", "structured"]


def _typed(ctx, dtype_name):
    base = ctx.inputs[_first_name(ctx)]
    if dtype_name == "bfloat16":
        import ml_dtypes
        return base.astype(ml_dtypes.bfloat16)
    if dtype_name == "structured":
        return np.zeros(base.shape, dtype=[("value", "<f4")])
    if dtype_name == "V4":
        return np.zeros(base.shape, dtype="V4")
    if dtype_name in ("<U3", "S3", "object"):
        return base.astype(dtype_name)
    if dtype_name == "datetime64[s]":
        return np.zeros(base.shape, dtype=dtype_name)
    return base.astype(dtype_name)


for _dtype in _DTYPES:
    def _dtype_scenario(ctx, dtype_name=_dtype):
        value = _typed(ctx, dtype_name)
        _run_with_first(ctx, value if ctx.device == "cpu" or dtype_name in ("object", "<U3", "S3", "V4",
                                                                             "structured", "datetime64[s]", ">f4")
                        else ctx.array(value))
    scenario(f"input dtype {_dtype}", kinds=("mlp", "multi"), devices=CPU if _dtype in (
        "object", "<U3", "S3", "datetime64[s]", ">f4", "V4", "structured", "bfloat16") else BOTH)(_dtype_scenario)


# ---- shapes -------------------------------------------------------------------------

_SHAPES = {"one column less": lambda s: (s[0], s[1] - 1), "one column more": lambda s: (s[0], s[1] + 1),
           "transposed": lambda s: s[::-1], "extra trailing axis": lambda s: s + (1,),
           "extra leading axis": lambda s: (1,) + s, "flattened": lambda s: (int(np.prod(s)),),
           "scalar": lambda s: (), "zero rows": lambda s: (0, s[1]), "zero columns": lambda s: (s[0], 0)}

for _label, _shape in _SHAPES.items():
    def _shape_scenario(ctx, shape=_shape):
        base = ctx.inputs[_first_name(ctx)]
        wanted = shape(base.shape)
        value = np.resize(base, wanted) if int(np.prod(wanted)) else np.zeros(wanted, base.dtype)
        _run_with_first(ctx, ctx.array(value))
    scenario(f"input shape {_label}", kinds=("mlp", "multi"))(_shape_scenario)


@scenario("input shape huge via zero strides", devices=CPU)
def _huge_shape(ctx):
    row = np.zeros(64, np.float32)
    _run_with_first(ctx, np.lib.stride_tricks.as_strided(row, shape=(2**40, 64), strides=(0, 4)))


# ---- layouts ------------------------------------------------------------------------

_LAYOUTS = {
    "fortran order": lambda xp, v: xp.asfortranarray(v),
    "every other column": lambda xp, v: xp.repeat(v, 2, axis=1)[:, ::2],
    "transposed view": lambda xp, v: xp.ascontiguousarray(v.T).T,
    "reversed rows": lambda xp, v: xp.ascontiguousarray(v[::-1])[::-1],
    "broadcast row": lambda xp, v: xp.broadcast_to(v[:1], v.shape),
    "strided last axis": lambda xp, v: xp.stack([v, v], axis=-1)[..., 0],
    "read-only": lambda xp, v: _read_only(v),
}


def _read_only(value):
    value = value.copy()
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    return value


for _label, _layout in _LAYOUTS.items():
    def _layout_scenario(ctx, layout=_layout):
        value = layout(ctx.xp, ctx.array(ctx.inputs[_first_name(ctx)]))
        _run_with_first(ctx, value)
    scenario(f"input layout {_label}", kinds=("mlp", "multi"))(_layout_scenario)


@scenario("input misaligned by one byte", devices=CPU)
def _misaligned(ctx):
    base = ctx.inputs[_first_name(ctx)]
    buffer = np.zeros(base.nbytes + 1, np.uint8)
    value = buffer[1:].view(base.dtype).reshape(base.shape)
    value[...] = base
    _run_with_first(ctx, value)


@scenario("input memmap", devices=CPU)
def _memmap(ctx):
    base = ctx.inputs[_first_name(ctx)]
    value = np.memmap(case_dir() / "input.bin", dtype=base.dtype, mode="w+", shape=base.shape)
    value[...] = base
    _run_with_first(ctx, value)


@scenario("input masked array", devices=CPU)
def _masked(ctx):
    base = ctx.inputs[_first_name(ctx)]
    _run_with_first(ctx, np.ma.masked_array(base, mask=np.zeros(base.shape, bool)))


@scenario("input matrix subclass", devices=CPU)
def _matrix(ctx):
    _run_with_first(ctx, np.asmatrix(ctx.inputs[_first_name(ctx)]))


# ---- objects that are not arrays -------------------------------------------------------

_OBJECTS = {"None": lambda v: None, "string": lambda v: "x", "int": lambda v: 42, "huge int": lambda v: 2**100,
            "float": lambda v: 3.14, "nested list": lambda v: v.tolist(), "tuple": lambda v: tuple(v.tolist()),
            "dict": lambda v: {"data": v}, "object": lambda v: object(), "bytes": lambda v: v.tobytes(),
            "memoryview": lambda v: memoryview(v), "generator": lambda v: (row for row in v),
            "numpy scalar": lambda v: np.float32(1.0), "0-d array": lambda v: np.asarray(np.float32(1.0))}

for _label, _make in _OBJECTS.items():
    def _object_scenario(ctx, make=_make):
        _run_with_first(ctx, make(ctx.inputs[_first_name(ctx)]))
    scenario(f"input object {_label}", kinds=("mlp", "multi"))(_object_scenario)


class _Interface:
    """An object whose __array_interface__ is what a test gives (or raises)."""

    def __init__(self, interface=None, error=None, keep=None):
        self._interface, self._error, self._keep = interface, error, keep

    @property
    def __array_interface__(self):
        if self._error is not None:
            raise self._error
        return self._interface


def _interface_of(value, **changes):
    interface = dict(value.__array_interface__)
    interface.update(changes)
    return {k: v for k, v in interface.items() if v is not _DROP}


_DROP = object()
_BROKEN = {
    "raises ValueError": lambda v: _Interface(error=ValueError("broken interface"), keep=v),
    "raises AttributeError": lambda v: _Interface(error=AttributeError("no interface"), keep=v),
    "is None": lambda v: _Interface(None, keep=v),
    "is a list": lambda v: _Interface([1, 2, 3], keep=v),
    "is empty": lambda v: _Interface({}, keep=v),
    "has no data": lambda v: _Interface(_interface_of(v, data=_DROP), keep=v),
    "has NULL data": lambda v: _Interface(_interface_of(v, data=(0, False)), keep=v),
    "has data None": lambda v: _Interface(_interface_of(v, data=None), keep=v),
    "has data as int": lambda v: _Interface(_interface_of(v, data=v.ctypes.data), keep=v),
    "has no shape": lambda v: _Interface(_interface_of(v, shape=_DROP), keep=v),
    "has shape as string": lambda v: _Interface(_interface_of(v, shape="4,64"), keep=v),
    "has negative shape": lambda v: _Interface(_interface_of(v, shape=(-v.shape[0],) + v.shape[1:]), keep=v),
    "has float shape": lambda v: _Interface(_interface_of(v, shape=tuple(float(d) for d in v.shape)), keep=v),
    "has huge shape": lambda v: _Interface(_interface_of(v, shape=(2**62,) + v.shape[1:]), keep=v),
    "has no typestr": lambda v: _Interface(_interface_of(v, typestr=_DROP), keep=v),
    "has typestr <f9": lambda v: _Interface(_interface_of(v, typestr="<f9"), keep=v),
    "has typestr zz": lambda v: _Interface(_interface_of(v, typestr="zz"), keep=v),
    "has typestr empty": lambda v: _Interface(_interface_of(v, typestr=""), keep=v),
    "has strides of wrong length": lambda v: _Interface(_interface_of(v, strides=(4,)), keep=v),
    "has negative strides": lambda v: _Interface(_interface_of(v, strides=tuple(-s for s in v.strides)), keep=v),
    "has huge strides": lambda v: _Interface(_interface_of(v, strides=(2**40, v.strides[-1])), keep=v),
    "has strides as string": lambda v: _Interface(_interface_of(v, strides="abc"), keep=v),
    "has odd byte strides": lambda v: _Interface(_interface_of(v, strides=(v.strides[0], 3)), keep=v),
}

def _unaligned_rows(value):
    """The same values laid out with a row stride one byte longer than compact: legal for
    the array interface (NumPy allows unaligned strides), not compact, and a stride that
    integer division by the item size would mistake for the compact one."""
    rows, columns = value.shape
    row_stride = columns * value.itemsize + 1
    buffer = np.zeros(rows * row_stride + 8, np.uint8)
    for row in range(rows):
        buffer[row * row_stride:row * row_stride + columns * value.itemsize] = value[row].view(np.uint8)
    interface = {"shape": value.shape, "typestr": value.dtype.str, "version": 3,
                 "data": (buffer.ctypes.data, False), "strides": (row_stride, value.itemsize)}
    return _Interface(interface, keep=buffer)


_BROKEN["has unaligned row strides"] = _unaligned_rows

for _label, _make in _BROKEN.items():
    def _broken_scenario(ctx, make=_make):
        value = ctx.inputs[_first_name(ctx)].copy()
        broken = make(value)
        inputs = ctx.good_inputs()
        inputs[_first_name(ctx)] = broken
        outputs = ctx.module.run(**inputs)
        ctx.check(outputs, what="outputs for an input with an odd __array_interface__")
    scenario(f"__array_interface__ {_label}", kinds=("mlp", "multi"), devices=CPU)(_broken_scenario)


# ---- which inputs ---------------------------------------------------------------------

@scenario("inputs missing", kinds=("mlp", "multi"))
def _missing(ctx):
    ctx.module.run()


@scenario("inputs one missing", kinds=("multi",))
def _one_missing(ctx):
    inputs = ctx.good_inputs()
    inputs.pop("b")
    ctx.module.run(**inputs)


@scenario("inputs extra keyword", kinds=("mlp", "multi"))
def _extra(ctx):
    ctx.module.run(**ctx.good_inputs(), extra=ctx.array(np.zeros(3, np.float32)))


@scenario("inputs name with spaces", kinds=("mlp",))
def _odd_name(ctx):
    ctx.module.run(**{"not an input": ctx.good_inputs()["x"]})


@scenario("inputs given twice", kinds=("mlp", "multi"))
def _twice(ctx):
    inputs = ctx.good_inputs()
    first = _first_name(ctx)
    ctx.module.run(inputs[first], **inputs)


@scenario("inputs too many positional", kinds=("mlp", "multi"))
def _too_many(ctx):
    inputs = list(ctx.good_inputs().values())
    ctx.module.run(*inputs, inputs[0])


@scenario("inputs positional", kinds=("mlp", "multi"))
def _positional(ctx):
    ctx.check(ctx.module.run(*ctx.good_inputs().values()))


@scenario("inputs swapped", kinds=("multi",))
def _swapped(ctx):
    inputs = ctx.good_inputs()
    ctx.module.run(a=inputs["b"], b=inputs["a"], idx=inputs["idx"])


# ---- run-time data --------------------------------------------------------------------

for _label, _indices in {"index past the end": [8, 0, 1], "index before the start": [-9, 0, 1],
                         "huge index": [2**40, 0, 1], "most negative index": [-2**63, 0, 1]}.items():
    def _index_scenario(ctx, indices=_indices):
        inputs = ctx.good_inputs()
        inputs["idx"] = ctx.array(np.array(indices, np.int64))
        outputs = ctx.module.run(**inputs)
        ctx.module.synchronize()  # a GPU kernel reports what it met when the work is done
        raise Wrong(f"accepted Gather indices {indices} out of range for an axis of 8 (ONNX: an error) "
                    f"and returned g = {ctx.host(outputs[2])[0][:3]}...")
    scenario(f"data {_label}", kinds=("multi",))(_index_scenario)


@scenario("data negative indices in range", kinds=("multi",))
def _negative_indices(ctx):
    inputs = ctx.good_inputs()
    indices = np.array([-1, -8, 3], np.int64)
    inputs["idx"] = ctx.array(indices)
    ctx.check(ctx.module.run(**inputs), libraries.multi_reference(ctx.inputs["a"], ctx.inputs["b"], indices))


@scenario("data NaN and inf", kinds=("mlp", "multi"))
def _nonfinite(ctx):
    value = ctx.inputs[_first_name(ctx)].copy()
    value.flat[0], value.flat[1], value.flat[2] = np.nan, np.inf, -np.inf
    inputs = ctx.good_inputs()
    inputs[_first_name(ctx)] = ctx.array(value)
    outputs = ctx.module.run(**inputs)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    host = dict(ctx.inputs)
    host[_first_name(ctx)] = value
    for got, want in zip(outputs, ctx.reference(**host)):
        got = ctx.host(got)
        if not np.array_equal(np.isnan(got), np.isnan(want)) and ctx.kind == "multi":
            raise Wrong("NaN positions differ from the reference")


# ---- out= -----------------------------------------------------------------------------

def _out_like(ctx, make):
    return [make(ctx.xp, ctx.array(np.zeros_like(e))) for e in ctx.expected]


def _run_out(ctx, out):
    result = ctx.module.run(**ctx.good_inputs(), out=out)
    outs = out if isinstance(out, (list, tuple)) else [out]
    ctx.check(outs, what="out= arrays")
    ctx.check(result, what="run()'s return value with out=")


_OUT_FORMS = {
    "wrong shape": lambda ctx: [ctx.array(np.zeros(e.shape[:-1] + (e.shape[-1] - 1,), e.dtype)) for e in ctx.expected],
    "wrong dtype": lambda ctx: [ctx.array(np.zeros(e.shape, np.float64)) for e in ctx.expected],
    "too many arrays": lambda ctx: _out_like(ctx, lambda xp, v: v) * 2,
    "empty list": lambda ctx: [],
    "tuple": lambda ctx: tuple(_out_like(ctx, lambda xp, v: v)),
    "list of None": lambda ctx: [None] * len(ctx.expected),
    "string": lambda ctx: "out",
    "int": lambda ctx: 5,
    "dict": lambda ctx: {"y": _out_like(ctx, lambda xp, v: v)[0]},
    "fortran order": lambda ctx: _out_like(ctx, lambda xp, v: xp.asfortranarray(xp.zeros(v.shape[::-1], v.dtype).T)),
    "every other column": lambda ctx: _out_like(ctx, lambda xp, v: xp.zeros(v.shape[:-1] + (2 * v.shape[-1],),
                                                                           v.dtype)[..., ::2]),
    "broadcast": lambda ctx: _out_like(ctx, lambda xp, v: xp.broadcast_to(v[:1], v.shape)),
    "read-only": lambda ctx: _out_like(ctx, lambda xp, v: _read_only(v)),
    "single array unwrapped": lambda ctx: _out_like(ctx, lambda xp, v: v)[0] if len(ctx.expected) == 1
    else _out_like(ctx, lambda xp, v: v)[0],
}

for _label, _make in _OUT_FORMS.items():
    def _out_scenario(ctx, make=_make):
        _run_out(ctx, make(ctx))
    scenario(f"out= {_label}", kinds=("mlp", "multi"))(_out_scenario)


@scenario("out= unaligned row strides", kinds=("mlp", "multi"), devices=CPU)
def _out_unaligned(ctx):
    outs = [_unaligned_rows(np.zeros_like(e)) for e in ctx.expected]
    ctx.module.run(**ctx.good_inputs(), out=outs)
    for index, (out, want) in enumerate(zip(outs, ctx.expected)):
        interface = out.__array_interface__
        rows, columns = want.shape
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * (rows * interface["strides"][0])).from_address(
            interface["data"][0]))
        got = np.stack([raw[r * interface["strides"][0]:r * interface["strides"][0] + columns * 4].view(np.float32)
                        for r in range(rows)])
        if not np.allclose(got, want, rtol=ctx.tolerance, atol=ctx.tolerance):
            raise Wrong(f"out= {index} with row stride {interface['strides'][0]} bytes: accepted, and the values "
                        f"read through those strides are not the answer (written as if compact?)")


@scenario("out= big-endian", devices=CPU)
def _out_big_endian(ctx):
    _run_out(ctx, [np.zeros(e.shape, ">f4") for e in ctx.expected])


@scenario("out= memmap", devices=CPU)
def _out_memmap(ctx):
    _run_out(ctx, [np.memmap(case_dir() / f"out{i}.bin", dtype=e.dtype, mode="w+", shape=e.shape)
                   for i, e in enumerate(ctx.expected)])


@scenario("out= NULL data interface", kinds=("mlp", "multi"), devices=CPU)
def _out_null(ctx):
    _run_out(ctx, [_Interface(_interface_of(np.zeros_like(e), data=(0, False))) for e in ctx.expected])


@scenario("out= view inside a guarded buffer", kinds=("mlp", "multi"))
def _out_guarded(ctx):
    """Writes only its own bytes: a guard region before and after stays untouched."""
    outs, buffers = [], []
    for e in ctx.expected:
        buffer = ctx.array(np.full(e.size + 64, 7.0, np.float32))
        buffers.append(buffer)
        outs.append(buffer[32:32 + e.size].reshape(e.shape))
    _run_out(ctx, outs)
    for buffer in buffers:
        host = ctx.host(buffer)
        if not (np.all(host[:32] == 7.0) and np.all(host[-32:] == 7.0)):
            raise Wrong("run() wrote outside the out= view's bytes")


@scenario("out= is an input", kinds=("multi",))
def _out_is_input(ctx):
    inputs = ctx.good_inputs()
    out = [inputs["a"], ctx.array(np.zeros((8, 8), np.float32)), ctx.array(np.zeros((3, 8), np.float32))]
    ctx.module.run(**inputs, out=out)
    ctx.check(out, what="outputs written over input a")


@scenario("out= second output is an input", kinds=("multi",))
def _out_second_is_input(ctx):
    inputs = ctx.good_inputs()
    out = [ctx.array(np.zeros((8, 8), np.float32)), inputs["a"], ctx.array(np.zeros((3, 8), np.float32))]
    ctx.module.run(**inputs, out=out)
    ctx.check(out, what="outputs written over input a")


@scenario("out= overlaps an input partly", kinds=("multi",))
def _out_partial_overlap(ctx):
    buffer = ctx.array(np.zeros(96, np.float32))
    a = buffer[:64].reshape(8, 8)
    a[...] = ctx.array(ctx.inputs["a"])
    inputs = ctx.good_inputs()
    inputs["a"] = a
    out = [buffer[32:96].reshape(8, 8), ctx.array(np.zeros((8, 8), np.float32)),
           ctx.array(np.zeros((3, 8), np.float32))]
    ctx.module.run(**inputs, out=out)
    ctx.check(out, what="outputs written partly over input a")


@scenario("out= two outputs share a buffer", kinds=("multi",))
def _out_aliased(ctx):
    shared = ctx.array(np.zeros((8, 8), np.float32))
    out = [shared, shared, ctx.array(np.zeros((3, 8), np.float32))]
    ctx.module.run(**ctx.good_inputs(), out=out)
    ctx.check(out, what="two outputs written into one buffer")


@scenario("inputs share a buffer", kinds=("multi",))
def _inputs_aliased(ctx):
    a = ctx.array(ctx.inputs["a"])
    ctx.check(ctx.module.run(a=a, b=a[0], idx=ctx.array(ctx.inputs["idx"])),
              libraries.multi_reference(ctx.inputs["a"], ctx.inputs["a"][0], ctx.inputs["idx"]))


# ---- stream= --------------------------------------------------------------------------

for _label, _stream in {"0": 0, "an int": 12345, "a string": "stream", "an object": object(), "-1": -1}.items():
    def _stream_scenario(ctx, stream=_stream):
        ctx.check(ctx.module.run(**ctx.good_inputs(), stream=stream), what="outputs with a stream= on cpu")
    scenario(f"stream= {_label} on cpu", kinds=("mlp",), devices=CPU)(_stream_scenario)
