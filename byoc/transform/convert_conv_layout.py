"""ConvertConvLayout: NCHW convolution chains of main become NHWC, with the layout
conversion placed once at each boundary of an NHWC region rather than around every conv.

Rewrites, in main, every `conv2d` with data_layout NCHW whose dtype is one of `dtypes`
(the convs an NHWC kernel library such as CUTLASS can take) into data_layout NHWC /
kernel_layout OHWI. Constant weights are transposed here; a weight computed at run time
gets a transpose call. The NHWC value then flows on, staying NHWC, through:

  - elementwise ops (relu, cast, clip, ...);
  - broadcasting ops (add, multiply, ...): a constant operand is transposed here, with
    the size-1 dims in front dropped, so a conv bias reshaped to (C, 1, 1) by the ONNX
    importer becomes the channel vector (C,) that conv epilogues take; any other NCHW
    operand gets one boundary transpose;
  - batch_norm on the channel axis (axis 1 -> 3), max/avg pooling and global pooling
    (layout NCHW -> NHWC), reductions (axes permuted), concat (axis permuted);
  - the model's own 4-D transposes. A model that runs part of its net channels-last
    (ConvNeXt's and Swin's `permute(0, 2, 3, 1)` around LayerNorm and Linear) transposes
    an NHWC value to NHWC: that is the NHWC value itself, no op. Any other permutation of
    an NHWC value is one transpose of it, composed. A transpose to NCHW of a value in the
    original layout (the `permute(0, 3, 1, 2)` back) has that value as its NHWC form, so
    the region goes on NHWC through it, and the next transpose to NHWC is no op either.

Every other consumer of an NHWC value (reshape/flatten, matmul, the function result, ...)
reads it through one transpose back to NCHW, made once per value. A conv whose input is
NCHW (a parameter, or the output of an op that stopped a region) reads it through one
transpose to NHWC. The rewritten graph computes exactly what the original did.

Leaves alone: functions other than main, convs of other dtypes (so a float32 model keeps
its NCHW convs for the built-in backend), convs already NHWC, and every op not reached by
an NHWC value.
"""
from __future__ import annotations

import numpy as np

from ..ir.expr import Binding, Call, Constant, Function, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.types import TensorType

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
CHANNEL_AXIS_NCHW = 1
POOL_OPS = ("max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d")


def convert_conv_layout(mod: IRModule, dtypes=("float16", "bfloat16")) -> IRModule:
    """main with its NCHW conv2d regions (of the given dtypes) converted to NHWC."""
    main = mod["main"]
    if not any(_converts(binding.value, dtypes) for binding in main.bindings):
        return mod
    mod = mod.copy()
    mod["main"] = _LayoutRewriter(dtypes).rewrite(main)
    return mod


def _converts(value, dtypes) -> bool:
    return isinstance(value, Call) and isinstance(value.op, Op) and value.op.name == "conv2d" and \
        value.attrs["data_layout"] == "NCHW" and value.type.dtype in dtypes


def _is_4d(expr) -> bool:
    return isinstance(expr.type, TensorType) and len(expr.type.shape) == 4


class _LayoutRewriter:
    def __init__(self, dtypes):
        self.dtypes = tuple(dtypes)
        self.bindings: list[Binding] = []
        self.nhwc: dict = {}  # original var -> its value in NHWC (a new var)
        self.nchw: dict = {}  # original var -> its value in the original layout
        self.to_nhwc_cache: dict = {}  # original var -> transpose of it to NHWC

    # ---- helpers -------------------------------------------------------------------------
    def emit(self, call: Call, name: str) -> Var:
        var = Var(name, call.type)
        self.bindings.append(Binding(var, call))
        return var

    def original(self, expr):
        """`expr` in its original layout (one transpose back per NHWC value)."""
        if not isinstance(expr, Var):
            if isinstance(expr, Tuple):
                return Tuple([self.original(f) for f in expr.fields])
            return expr
        if expr in self.nchw:
            return self.nchw[expr]
        if expr in self.nhwc:
            back = self.emit(Call("transpose", [self.nhwc[expr]], {"axes": TO_NCHW}), f"{expr.name_hint}_nchw")
            self.nchw[expr] = back
            return back
        return expr  # a parameter

    def as_nhwc(self, expr):
        """A 4-D `expr` of the original graph as NHWC: converted values as they are,
        constants transposed here, anything else through one transpose."""
        if isinstance(expr, Var) and expr in self.nhwc:
            return self.nhwc[expr]
        if isinstance(expr, Constant):
            return Constant(np.ascontiguousarray(expr.data.transpose(TO_NHWC)), expr.type.dtype)
        if expr not in self.to_nhwc_cache:
            self.to_nhwc_cache[expr] = self.emit(
                Call("transpose", [self.original(expr)], {"axes": TO_NHWC}), f"{expr.name_hint}_nhwc")
        return self.to_nhwc_cache[expr]

    def broadcast_operand(self, expr):
        """An operand broadcast against an NHWC value (of rank <= 4) as NHWC."""
        if isinstance(expr, Var) and expr in self.nhwc:
            return self.nhwc[expr]
        shape = tuple(expr.type.shape)
        if all(size == 1 for size in shape):
            return self.original(expr)  # a scalar-like operand has no layout
        if isinstance(expr, Constant):
            data = expr.data.reshape((1,) * (4 - len(shape)) + shape).transpose(TO_NHWC)
            while data.ndim > 1 and data.shape[0] == 1:  # leading size-1 dims broadcast anyway
                data = data[0]
            return Constant(np.ascontiguousarray(data), expr.type.dtype)
        if len(shape) < 4:
            expr = self.emit(Call("reshape", [self.original(expr)], {"shape": (1,) * (4 - len(shape)) + shape}),
                             f"{expr.name_hint}_4d")
            return self.emit(Call("transpose", [expr], {"axes": TO_NHWC}), f"{expr.name_hint}_nhwc")
        return self.as_nhwc(expr)

    # ---- the walk ------------------------------------------------------------------------
    def rewrite(self, main: Function) -> Function:
        for binding in main.bindings:
            value = binding.value
            converted = None
            if isinstance(value, Call) and isinstance(value.op, Op):
                converted = self.convert_call(binding.var, value)
            if converted is not None:
                self.nhwc[binding.var] = self.emit(converted, binding.var.name_hint)
                continue
            if self.transpose_alias(binding.var, value):
                continue
            reduced = self.reduce_to_original(value)
            if reduced is not None:
                self.nchw[binding.var] = self.emit(reduced, binding.var.name_hint)
                continue
            self.nchw[binding.var] = self.emit_original(binding.var, value)
        result = self.original(main.result)
        return Function(main.params, self.bindings, result, main.ret_type, main.attrs)

    def emit_original(self, var, value):
        """The binding as it was, its NHWC operands read back in NCHW."""
        if isinstance(value, Call):
            explicit_type = None if isinstance(value.op, Op) else value.type
            value = Call(value.op, [self.original(a) for a in value.args], value.attrs, type_=explicit_type)
        elif isinstance(value, Tuple):
            value = Tuple([self.original(f) for f in value.fields])
        elif isinstance(value, TupleGetItem):
            value = TupleGetItem(self.original(value.tuple_value), value.index)
        new_var = Var(var.name_hint, value.type)
        self.bindings.append(Binding(new_var, value))
        return new_var

    def convert_call(self, var, call: Call):
        """The NHWC form of `call`, or None when it stays in the original layout."""
        name = call.op.name
        if name == "conv2d":
            if not _converts(call, self.dtypes):
                return None
            data, weight = call.args
            attrs = dict(call.attrs, data_layout="NHWC", kernel_layout="OHWI")
            return Call("conv2d", [self.as_nhwc(data), self.as_nhwc(weight)], attrs)
        nhwc_args = [a for a in call.args if isinstance(a, Var) and a in self.nhwc]
        if not nhwc_args:
            return None
        category = call.op.category
        if category == "elemwise":
            return Call(call.op, [self.nhwc[call.args[0]]], call.attrs)
        if category == "broadcast":
            if not _is_4d(call) or any(len(a.type.shape) > 4 for a in call.args):
                return None
            return Call(call.op, [self.broadcast_operand(a) for a in call.args], call.attrs)
        if name in POOL_OPS and call.attrs["layout"] == "NCHW":
            return Call(call.op, [self.nhwc[call.args[0]]], dict(call.attrs, layout="NHWC"))
        if name == "batch_norm" and call.attrs["axis"] % 4 == CHANNEL_AXIS_NCHW:
            return Call(call.op, [self.nhwc[call.args[0]]] + [self.original(a) for a in call.args[1:]],
                        dict(call.attrs, axis=3))
        if name == "concat" and all(_is_4d(a) for a in call.args):
            axis = TO_NHWC.index(call.attrs["axis"] % 4)
            return Call(call.op, [self.as_nhwc(a) for a in call.args], dict(call.attrs, axis=axis))
        if _is_nhwc_reduction(call, self.nhwc) and call.attrs["keepdims"]:
            return Call(call.op, [self.nhwc[call.args[0]]], dict(call.attrs, axes=_nhwc_axes(call)))
        return None

    def transpose_alias(self, var, call) -> bool:
        """The model's 4-D transposes (module docstring): record what `var` is, its value
        in the original layout or its NHWC form, and say True; False for any other binding."""
        if not (isinstance(call, Call) and isinstance(call.op, Op) and call.op.name == "transpose"
                and _is_4d(call)):
            return False
        from ..ops.layout import _transpose_axes  # axes=() reverses the dims
        arg, perm = call.args[0], _transpose_axes("transpose", call.attrs["axes"], 4)
        if isinstance(arg, Var) and arg in self.nhwc:
            # out[i] = original[perm[i]] and original[j] = nhwc[TO_NCHW[j]]
            composed = tuple(TO_NCHW[axis] for axis in perm)
            if composed == (0, 1, 2, 3):
                self.nchw[var] = self.nhwc[arg]
            else:
                self.nchw[var] = self.emit(Call("transpose", [self.nhwc[arg]], {"axes": composed}), var.name_hint)
            return True
        if perm == TO_NCHW and isinstance(arg, Var):
            self.nhwc[var] = self.original(arg)
            return True
        return False

    def reduce_to_original(self, call):
        """A reduction without keepdims of an NHWC value whose remaining axes come out in
        the original order (mean over H and W: (N, C) either way), computed on the NHWC
        value; None otherwise."""
        if not isinstance(call, Call) or not _is_nhwc_reduction(call, self.nhwc) or call.attrs["keepdims"]:
            return None
        reduced = {axis % 4 for axis in call.attrs["axes"]}
        kept_nchw = [axis for axis in range(4) if axis not in reduced]
        kept_nhwc = [axis for axis in TO_NHWC if axis not in reduced]
        if kept_nchw != kept_nhwc:
            return None
        return Call(call.op, [self.nhwc[call.args[0]]], dict(call.attrs, axes=_nhwc_axes(call)))


def _is_nhwc_reduction(call, nhwc) -> bool:
    return isinstance(call.op, Op) and call.op.category == "reduce" and \
        call.op.name not in ("argmax", "argmin") and bool(call.attrs["axes"]) and call.args[0] in nhwc


def _nhwc_axes(call) -> tuple:
    return tuple(sorted(TO_NHWC.index(axis % 4) for axis in call.attrs["axes"]))
