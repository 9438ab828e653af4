"""ConvertToFloat16: run a float32 model's computation in float16 (or bfloat16).

Rewrites every function that has a body (global or nested), one at a time, keeping its
signature. Each op call with float32 inputs runs in one of two dtypes:

- float32, for the ops in `keep_float32_ops` (DEFAULT_KEEP_FLOAT32_OPS below says why
  each is there): their float32 inputs are given to them in float32;
- the low-precision dtype for the compute-bound ops in ALWAYS_CONVERTED_OPS (matmul,
  conv2d: what tensor cores speed up);
- for every other op ("follow" ops), the dtype that needs fewer new casts of its
  inputs: an input is free in a dtype it was computed in or already cast to for an
  earlier consumer, constants are free in any dtype, and a parameter is free in both
  (its one cast at the entry is shared). Ties, ops on constants only included, go to
  low precision. So the elementwise ops around a kept op (the subtract, add and sqrt of
  a layer norm written out op by op) stay in float32 with it, and the ops fed by the
  low-precision stream join it.

Casts are inserted only where a value is needed in a dtype it does not have yet, once per
value and dtype (two consumers share one cast; consecutive float32 ops need none), always
from the value as computed, so there is never a cast of an inserted cast. A `cast(x,
float32)` of the model itself (an int mask made float, say) is not emitted as such: its
consumers get `cast(x, float16)` directly.

The interface stays float32 (a choice: callers keep feeding and reading float32 and the
library's ABI does not change with precision): a float32 parameter that a
low-precision op reads is cast once at the entry of the function (float32 ops read the
parameter itself, with no round trip), and a float32 result computed in low precision is
cast back at the exit. Calls to global functions, extern symbols and local functions are
interfaces too: they get and return float32.

Float32 constants that low-precision ops read become low-precision Constants, converted
here rather than cast at run time. Finite values beyond the low dtype's range saturate to
its largest finite value instead of becoming infinities, so that masks written as -1e9 or
float32's lowest value stay usable (0 * -inf would be NaN).

Leaves alone: computation on integers, booleans and other float dtypes; signatures;
attributes; extern declarations. It removes nothing: run dead_code_elimination after it.
"""
from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np

from ..ir.expr import Binding, Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.op import Op, get_op
from ..ir.types import TensorType, TupleType, Type, is_float, numpy_dtype

FLOAT32 = "float32"
LOW_PRECISION_DTYPES = ("float16", "bfloat16")

# Ops that keep computing in float32. Their trouble is range and accumulation, not the
# speed of the op itself (all are memory-bound), so keeping them costs little:
# - sum, mean, prod, cumsum: accumulating many terms (in float16, 2048 + 1 rounds back
#   to 2048), and a product leaves the range quickly;
# - softmax, log_softmax: an exp and a sum; attention scores must not saturate;
# - layer_norm, rms_norm: mean and variance are statistics over many values, and epsilon
#   (1e-5 .. 1e-12) vanishes next to a float16 variance. The built-in shim kernels
#   already accumulate in float32 internally; a deployment whose every backend does the
#   same may drop these two from the set to save their casts;
# - exp, power, reciprocal, rsqrt: results leave float16's range (exp overflows above
#   11.1, 1/x below 1.5e-5, x**2 above 256); log: its inputs are sums that float16 would
#   have rounded or underflowed. These are also the pieces of softmax and normalizations
#   that ONNX exporters write out op by op, so keeping them makes such a decomposition
#   run in float32 as a whole (the ops between them follow).
# PyTorch's autocast keeps essentially the same list in float32.
# batch_norm is NOT kept: at inference it computes no statistics (mean and variance are
# given, usually constants); it is a per-channel scale and shift. Keeping it would put a
# cast pair around every conv of a CNN (31 casts for 56 ops in the resnet_small test
# fixture, against 2 without, at the same error).
DEFAULT_KEEP_FLOAT32_OPS = frozenset({
    "sum", "mean", "prod", "cumsum",
    "softmax", "log_softmax",
    "layer_norm", "rms_norm",
    "exp", "log", "power", "reciprocal", "rsqrt",
})

# Ops that always run in low precision, whatever their inputs: the compute-bound ones.
ALWAYS_CONVERTED_OPS = frozenset({"matmul", "conv2d"})

# Suffixes of the names of inserted casts.
_DTYPE_SUFFIX = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}


def _suffixed(name_hint: str, dtype: str) -> str:
    return f"{name_hint}_{_DTYPE_SUFFIX.get(dtype, dtype)}"


def _cast(atom: Expr, dtype: str) -> Call:
    return Call("cast", [atom], {"dtype": dtype})


def convert_to_float16(mod: IRModule, dtype: str = "float16",
                       keep_float32_ops=DEFAULT_KEEP_FLOAT32_OPS) -> IRModule:
    """A new module whose float32 computation runs in `dtype` ("float16" or "bfloat16"),
    except for the ops in `keep_float32_ops` (op names), which run in float32."""
    if dtype not in LOW_PRECISION_DTYPES:
        raise ValueError(f"convert_to_float16: dtype {dtype!r} is not one of "
                         f"{', '.join(LOW_PRECISION_DTYPES)}")
    keep_float32_ops = frozenset(keep_float32_ops)
    for name in sorted(keep_float32_ops):
        try:
            get_op(name)
        except KeyError:
            raise ValueError(
                f"convert_to_float16: keep_float32_ops names {name!r}, which is not an op") from None
    constants = _ConstantConverter()
    constants.convert_all(_weights_of_converted_ops(mod, ALWAYS_CONVERTED_OPS - keep_float32_ops), dtype)
    functions = {name: _convert_function(func, dtype, keep_float32_ops, constants)
                 for name, func in mod.items()}
    return IRModule(functions, mod.attrs)


def _convert_function(func: Function, dtype: str, keep_float32_ops, constants) -> Function:
    if func.is_extern:
        return func
    return _FunctionConverter(dtype, keep_float32_ops, constants).run(func)


# ---------------------------------------------------------------- constants


class _ConstantConverter:
    """Float32 constants converted to other float dtypes, once per constant and dtype, so
    that a weight read by several ops stays one Constant."""

    def __init__(self):
        # (id of the original, dtype) -> (original, converted); holding the original keeps
        # its id from being reused by another object while the pass runs.
        self.cache: dict[tuple[int, str], tuple[Constant, Constant]] = {}

    def convert_all(self, constants: list, dtype: str):
        """Convert `constants` now, all at once (_saturating_convert_all: in pieces, on
        several threads): a BERT-base's matmul weights are 110M values, 0.5 s on one core."""
        todo = list({id(constant): constant for constant in constants
                     if (id(constant), dtype) not in self.cache}.values())
        converted = _saturating_convert_all([constant.data for constant in todo], dtype)
        for constant, data in zip(todo, converted):
            self.cache[(id(constant), dtype)] = (constant, Constant(data, dtype))

    def convert(self, constant: Constant, dtype: str) -> Constant:
        key = (id(constant), dtype)
        if key not in self.cache:
            self.cache[key] = (constant, Constant(_saturating_convert_all([constant.data], dtype)[0], dtype))
        return self.cache[key][1]


def _weights_of_converted_ops(mod: IRModule, ops, min_bytes: int = 1 << 20) -> list:
    """The float32 constants of at least `min_bytes` that calls of `ops` read, once each: the
    ops that always run in low precision (matmul and conv2d, unless kept in float32), so these
    are converted whatever else the pass decides."""
    found = {}

    def walk(func: Function):
        for binding in func.bindings:
            value = binding.value
            if isinstance(value, Function):
                walk(value)
            elif isinstance(value, Call) and isinstance(value.op, Op) and value.op.name in ops:
                for arg in value.args:
                    if isinstance(arg, Constant) and arg.type.dtype == FLOAT32 and arg.data.nbytes >= min_bytes:
                        found[id(arg)] = arg

    for _, func in mod.items():
        if not func.is_extern:
            walk(func)
    return list(found.values())


# Values per piece of a conversion: pieces, not whole weights, are what the threads share,
# so that one large weight (a decoder's 262 MB embedding) does not keep one core busy while
# the others idle. 16 MB of float32: large beside a thread's overhead, small beside a weight.
CONVERT_PIECE_VALUES = 1 << 22


def _saturating_convert_all(arrays: list, dtype: str) -> list:
    """Each of `arrays` (float32) in `dtype`, finite values beyond its range clamped to its
    largest finite value (infinities and NaNs stay as they are), converted in pieces of at
    most CONVERT_PIECE_VALUES values on several threads (NumPy's casts let go of the GIL)."""
    from ..threads import map_on_threads
    target = numpy_dtype(dtype)
    largest = float(ml_dtypes.finfo(target).max)
    sources = [np.ascontiguousarray(array).reshape(-1) for array in arrays]
    outputs = [np.empty(np.shape(array), target) for array in arrays]
    pieces = [(source[start:start + CONVERT_PIECE_VALUES], output.reshape(-1)[start:start + CONVERT_PIECE_VALUES])
              for source, output in zip(sources, outputs) for start in range(0, source.size, CONVERT_PIECE_VALUES)]
    map_on_threads(lambda piece: _saturating_convert_piece(*piece, largest), pieces)
    return outputs


def _saturating_convert_piece(source: np.ndarray, output: np.ndarray, largest: float):
    """`source` converted into `output` (one piece of _saturating_convert_all)."""
    # The range of the float32 source decides whether anything can overflow: two reductions
    # at memory speed, where testing the converted values for infinities (the usual case:
    # none) cost half as much again as the conversion itself. A NaN makes both comparisons
    # false, so a piece with one takes the careful path, which keeps it.
    if -largest <= source.min() and source.max() <= largest:
        np.copyto(output, source, casting="unsafe")
        return
    with np.errstate(over="ignore", invalid="ignore"):
        clamped = np.where(np.isfinite(source), np.clip(source, -largest, largest), source)
        np.copyto(output, clamped, casting="unsafe")


# ---------------------------------------------------------------- values


class _TensorValue:
    """A tensor of the original function, and the atoms that hold it in each dtype.

    `versions` maps a dtype to an atom with the value in that dtype; its first entry is
    the value as computed, from which every other version is cast. A value can also have
    no version yet and know how to make one: a constant (converted at compile time) or the
    model's own `cast(source, float32)` (made by casting the source directly). The casts
    of a parameter (`is_parameter`) go at the entry of the function."""

    def __init__(self, original_type: TensorType, name_hint: str, versions: dict | None = None,
                 constant: Constant | None = None, cast_source: "_TensorValue | None" = None,
                 is_parameter: bool = False):
        self.original_type = original_type
        self.name_hint = name_hint
        self.versions: dict[str, Expr] = dict(versions or {})
        self.constant = constant
        self.cast_source = cast_source
        self.is_parameter = is_parameter

    @property
    def is_float32(self) -> bool:
        return self.original_type.dtype == FLOAT32


class _TupleValue:
    """A tuple of the original function. Its fields are known values (for a tuple
    expression of the model) or are read out of a tuple atom on demand (`%t.i`)."""

    def __init__(self, original_type: TupleType, name_hint: str, fields: list | None = None,
                 atom: Expr | None = None, make_field: Callable | None = None):
        self.original_type = original_type
        self.name_hint = name_hint
        self.fields = list(fields) if fields is not None else [None] * len(original_type.fields)
        # The tuple's type in the dtypes asked for -> an atom holding it.
        self.atoms: dict[Type, Expr] = {atom.type: atom} if atom is not None else {}
        # (field atom, original field type) -> the field's value.
        self.make_field = make_field


class _OpaqueValue:
    """A local function, a global or an extern symbol: passed through as it is."""

    def __init__(self, atom: Expr):
        self.atom = atom


def _retyped(type_: Type, float32_as: str) -> Type:
    """`type_` with every float32 tensor in it turned into `float32_as`."""
    if isinstance(type_, TupleType):
        return TupleType(tuple(_retyped(field, float32_as) for field in type_.fields))
    if isinstance(type_, TensorType) and type_.dtype == FLOAT32:
        return TensorType(type_.shape, float32_as)
    return type_


def _has_float32(type_: Type) -> bool:
    if isinstance(type_, TupleType):
        return any(_has_float32(field) for field in type_.fields)
    return isinstance(type_, TensorType) and type_.dtype == FLOAT32


# ---------------------------------------------------------------- one function


class _FunctionConverter:
    def __init__(self, low_dtype: str, keep_float32_ops, constants: _ConstantConverter):
        self.low_dtype = low_dtype
        self.keep_float32_ops = keep_float32_ops
        self.constants = constants
        self.entry_bindings: list[Binding] = []  # casts of parameters
        self.bindings: list[Binding] = []
        self.values: dict[Var, object] = {}

    def run(self, func: Function) -> Function:
        for param in func.params:
            self.values[param] = self.parameter_value(param)
        for binding in func.bindings:
            self.values[binding.var] = self.convert_binding(binding)
        # The function's own interface: float32 stays float32.
        result = self.atom(func.result, FLOAT32)
        return Function(func.params, self.entry_bindings + self.bindings, result, func.ret_type, func.attrs)

    def convert_nested(self, func: Function) -> Function:
        """A local function, converted on its own (it sees nothing of this one)."""
        return _convert_function(func, self.low_dtype, self.keep_float32_ops, self.constants)

    # ----------------------------------------------------------- values and atoms

    def emit(self, value: Expr, name_hint: str, at_entry: bool = False) -> Var:
        var = Var(name_hint, value.type)
        (self.entry_bindings if at_entry else self.bindings).append(Binding(var, value))
        return var

    def parameter_value(self, param: Var):
        def parameter_like(atom: Expr, original_type: Type, at_entry: bool):
            if isinstance(original_type, TupleType):
                # Its fields are read out in the body, so their casts cannot go first.
                return _TupleValue(original_type, atom.name_hint, atom=atom,
                                   make_field=lambda field_atom, field_type: parameter_like(
                                       field_atom, field_type, False))
            if original_type.dtype != FLOAT32:
                return _TensorValue(original_type, atom.name_hint, {original_type.dtype: atom})
            # Float32 on the interface, but meant to be computed on in low precision.
            return _TensorValue(original_type, atom.name_hint, {FLOAT32: atom}, is_parameter=at_entry)
        if isinstance(param.type, (TensorType, TupleType)):
            return parameter_like(param, param.type, True)
        return _OpaqueValue(param)

    def computed_value(self, atom: Expr, original_type: Type, computed_in: str):
        """The value of an op or call result `atom`, computed in `computed_in` where the
        original was float32."""
        if isinstance(original_type, TupleType):
            return _TupleValue(original_type, atom.name_hint, atom=atom,
                               make_field=lambda field_atom, field_type: self.computed_value(
                                   field_atom, field_type, computed_in))
        if isinstance(original_type, TensorType):
            if original_type.dtype != FLOAT32:
                return _TensorValue(original_type, atom.name_hint, {original_type.dtype: atom})
            return _TensorValue(original_type, atom.name_hint, {computed_in: atom})
        return _OpaqueValue(atom)

    def value_of(self, expr: Expr):
        if isinstance(expr, Var):
            return self.values[expr]
        if isinstance(expr, Constant):
            return _TensorValue(expr.type, "const", {expr.type.dtype: expr},
                                constant=expr if expr.type.dtype == FLOAT32 else None)
        if isinstance(expr, Tuple):
            return _TupleValue(expr.type, "tuple", fields=[self.value_of(field) for field in expr.fields])
        if isinstance(expr, Function):
            return _OpaqueValue(self.convert_nested(expr))
        return _OpaqueValue(expr)  # GlobalVar, ExternFunc

    def atom(self, expr: Expr, float32_as: str) -> Expr:
        """An atom for `expr` in which every float32 tensor of the original is `float32_as`."""
        if isinstance(expr, Tuple):
            return Tuple([self.atom(field, float32_as) for field in expr.fields])
        return self.value_atom(self.value_of(expr), float32_as)

    def value_atom(self, value, float32_as: str) -> Expr:
        if isinstance(value, _OpaqueValue):
            return value.atom
        if isinstance(value, _TensorValue):
            dtype = float32_as if value.is_float32 else value.original_type.dtype
            return self.version(value, dtype)
        wanted = _retyped(value.original_type, float32_as)
        if wanted not in value.atoms:
            fields = [self.value_atom(self.tuple_field(value, index), float32_as)
                      for index in range(len(value.fields))]
            # The model's own tuple keeps its name; a retyped copy of a tuple gets a suffix.
            name_hint = _suffixed(value.name_hint, float32_as) if value.atoms else value.name_hint
            value.atoms[wanted] = self.emit(Tuple(fields), name_hint)
        return value.atoms[wanted]

    def tuple_field(self, value: _TupleValue, index: int, name_hint: str | None = None):
        if value.fields[index] is None:
            # Read it out of whichever atom the tuple has (they hold the same values).
            tuple_atom = next(iter(value.atoms.values()))
            field_atom = self.emit(TupleGetItem(tuple_atom, index), name_hint or f"{value.name_hint}_{index}")
            value.fields[index] = value.make_field(field_atom, value.original_type.fields[index])
        return value.fields[index]

    def version(self, value: _TensorValue, dtype: str, name_hint: str | None = None) -> Expr:
        """An atom with `value` in `dtype`, made (and remembered) if there is none yet."""
        if dtype not in value.versions:
            name_hint = name_hint or _suffixed(value.name_hint, dtype)
            if value.constant is not None:
                value.versions[dtype] = self.constants.convert(value.constant, dtype)
            elif value.cast_source is not None:
                # The model's cast(source, float32): cast the source straight to `dtype`.
                source_dtype = value.cast_source.original_type.dtype
                source_atom = self.version(value.cast_source, source_dtype)
                if source_dtype == dtype:
                    value.versions[dtype] = source_atom
                else:
                    # To float32 it is exactly the model's cast: it keeps the model's name.
                    cast_name = value.name_hint if dtype == FLOAT32 else name_hint
                    value.versions[dtype] = self.emit(_cast(source_atom, dtype), cast_name)
            else:
                as_computed = next(iter(value.versions.values()))
                value.versions[dtype] = self.emit(_cast(as_computed, dtype), name_hint,
                                                  at_entry=value.is_parameter)
        return value.versions[dtype]

    def most_precise_version(self, value: _TensorValue) -> Expr:
        """The value as computed (float32 for constants and the model's own casts)."""
        if value.versions:
            return next(iter(value.versions.values()))
        return self.version(value, FLOAT32)

    # ----------------------------------------------------------- bindings

    def convert_binding(self, binding: Binding):
        """Emit what `binding` becomes; returns the value its variable now stands for."""
        value, name_hint = binding.value, binding.var.name_hint
        if isinstance(value, Call) and isinstance(value.op, Op):
            if value.op.name == "cast":
                return self.convert_cast(value, name_hint)
            return self.convert_op_call(value, name_hint)
        if isinstance(value, Call):
            return self.convert_interface_call(value, name_hint)
        if isinstance(value, TupleGetItem):
            tuple_value = self.value_of(value.tuple_value)
            return self.tuple_field(tuple_value, value.index, name_hint)
        if isinstance(value, Tuple):
            tuple_value = self.value_of(value)
            tuple_value.name_hint = name_hint
            return tuple_value
        if isinstance(value, Function):
            return _OpaqueValue(self.emit(self.convert_nested(value), name_hint))
        return self.value_of(value)  # a binding that renames a variable or a constant

    def compute_dtype(self, call: Call) -> str:
        op_name = call.op.name
        if op_name in self.keep_float32_ops:
            return FLOAT32
        if op_name in ALWAYS_CONVERTED_OPS:
            return self.low_dtype
        # A "follow" op: the dtype that needs fewer new casts of its inputs; ties go to
        # low precision.
        inputs = self.float32_inputs(call)
        low_casts = sum(self.needs_new_cast(value, self.low_dtype) for value in inputs)
        float32_casts = sum(self.needs_new_cast(value, FLOAT32) for value in inputs)
        return FLOAT32 if float32_casts < low_casts else self.low_dtype

    def float32_inputs(self, call: Call) -> list[_TensorValue]:
        """The values of the float32 tensors among the arguments (tuple fields included)."""
        found = []

        def visit(value):
            if isinstance(value, _TensorValue) and value.is_float32:
                found.append(value)
            elif isinstance(value, _TupleValue):
                for index in range(len(value.fields)):
                    visit(self.tuple_field(value, index))

        for arg in call.args:
            visit(self.value_of(arg))
        return found

    def needs_new_cast(self, value: _TensorValue, dtype: str) -> bool:
        """Whether giving `value` to an op in `dtype` would add a cast."""
        if value.constant is not None or dtype in value.versions:
            return False
        if value.is_parameter and dtype == self.low_dtype:
            return False  # its cast at the entry is there to be shared
        if value.cast_source is not None and value.cast_source.original_type.dtype == dtype:
            return False
        return True

    def convert_op_call(self, call: Call, name_hint: str):
        if not any(_has_float32(arg.type) for arg in call.args):
            # No float32 input: integer, boolean or other-float computation, left as it is.
            args = [self.atom(arg, FLOAT32) for arg in call.args]
            return self.computed_value(self.emit(Call(call.op, args, call.attrs, type_=call.type), name_hint),
                                       call.type, FLOAT32)
        dtype = self.compute_dtype(call)
        args = [self.atom(arg, dtype) for arg in call.args]
        # Type inference gives the result in the compute dtype.
        result = self.emit(Call(call.op, args, call.attrs), name_hint)
        return self.computed_value(result, call.type, dtype)

    def convert_cast(self, call: Call, name_hint: str):
        source = self.value_of(call.args[0])
        source_dtype = source.original_type.dtype
        target = call.attrs["dtype"]
        if target == FLOAT32:
            if source_dtype == FLOAT32:
                return source  # a no-op cast
            # Emitted only where a consumer needs it, and then straight to the dtype it needs.
            return _TensorValue(call.type, name_hint, cast_source=source)
        if source_dtype != FLOAT32:
            return self.convert_op_call(call, name_hint)  # nothing float32 about it
        if is_float(target):
            # From the value as computed (or as a converted constant): no double rounding
            # through float32, and no cast at all when the value already is `target`.
            atom = self.version(source, target, name_hint)
        else:
            # Float to integer or bool: from the most precise version there is.
            atom = self.emit(_cast(self.most_precise_version(source), target), name_hint)
        return _TensorValue(call.type, name_hint, {target: atom})

    def convert_interface_call(self, call: Call, name_hint: str):
        """A call to a global, an extern symbol or a local function: float32 in and out."""
        callee = call.op
        if isinstance(callee, (Var, Function)):
            callee = self.value_atom(self.value_of(callee), FLOAT32)
        args = [self.atom(arg, FLOAT32) for arg in call.args]
        result = self.emit(Call(callee, args, call.attrs, type_=call.type), name_hint)
        return self.computed_value(result, call.type, FLOAT32)
