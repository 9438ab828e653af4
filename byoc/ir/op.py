"""The operator registry: every op's attribute schema, type inference and NumPy reference.

Ops are registered by the modules of `byoc.ops` with `register_op`. A Call to an op
normalizes its attributes against the schema (defaults filled in, kinds checked) and
infers its result type eagerly, so a badly typed call fails where it is made.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import TypeInferenceError

REQUIRED = object()

# kind -> (python check, normalizer)
ATTR_KINDS = ("int", "float", "str", "bool", "ints", "floats", "dtype", "optional_int", "optional_float")


@dataclass(frozen=True)
class AttrSpec:
    kind: str
    default: Any = REQUIRED

    def __post_init__(self):
        if self.kind not in ATTR_KINDS:
            raise ValueError(f"attribute kind {self.kind!r} is not one of {ATTR_KINDS}")


def _normalize_value(op_name: str, attr_name: str, spec: AttrSpec, value):
    from .types import NUMPY_DTYPES

    def fail(expected):
        raise TypeInferenceError(
            f"{op_name}: attribute {attr_name}={value!r} is not {expected}")

    def is_number(item) -> bool:
        return not isinstance(item, bool) and (isinstance(item, (int, float)) or hasattr(item, "__float__"))

    def to_float(item) -> float:
        try:
            return float(item)
        except OverflowError:  # an int too large for a double would silently become inf
            fail("a number within the float64 range")

    kind = spec.kind
    if kind in ("optional_int", "optional_float") and value is None:
        return None
    if kind in ("int", "optional_int"):
        if isinstance(value, bool) or not hasattr(value, "__index__") or not _in_int64(int(value)):
            fail("a 64-bit integer")  # generated C++ carries it as an int64_t literal
        return int(value)
    if kind in ("float", "optional_float"):
        if not is_number(value):
            fail("a number")
        return to_float(value)
    if kind == "bool":
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        fail("a boolean")
    if kind == "str":
        if not isinstance(value, str):
            fail("a string")
        return value
    if kind == "dtype":
        # Check the type first: an unhashable value (a list) cannot be looked up.
        if not isinstance(value, str) or value not in NUMPY_DTYPES:
            fail(f"a dtype name ({', '.join(NUMPY_DTYPES)})")
        return value
    if kind == "ints":
        if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not hasattr(v, "__index__")
                                                       or not _in_int64(int(v)) for v in value):
            fail("a list of 64-bit integers")
        return tuple(int(v) for v in value)
    if kind == "floats":
        if not isinstance(value, (list, tuple)) or not all(is_number(v) for v in value):
            fail("a list of numbers")
        return tuple(to_float(v) for v in value)
    raise AssertionError(kind)


def _in_int64(value: int) -> bool:
    return -(1 << 63) <= value < (1 << 63)


@dataclass(eq=False)
class Op:
    """An operator. `Call(op, args, attrs)` applies it; ops compare by identity (one per name)."""

    name: str
    num_inputs: int | tuple[int, int | None]
    attrs: dict[str, AttrSpec]
    infer: Callable
    reference: Callable
    category: str = "opaque"  # elemwise | broadcast | injective | reduce | opaque
    doc: str = ""
    onnx_ops: tuple[str, ...] = field(default=())

    def check_arity(self, count: int):
        if isinstance(self.num_inputs, int):
            low, high = self.num_inputs, self.num_inputs
        else:
            low, high = self.num_inputs
        if count < low or (high is not None and count > high):
            expected = str(low) if low == high else f"{low}..{high if high is not None else 'any'}"
            raise TypeInferenceError(f"{self.name} takes {expected} inputs, got {count}")

    def normalize_attrs(self, attrs: dict | None) -> dict:
        attrs = dict(attrs or {})
        unknown = sorted(set(attrs) - set(self.attrs))
        if unknown:
            raise TypeInferenceError(
                f"{self.name}: unknown attribute(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(self.attrs) or 'none'}")
        result = {}
        for name, spec in self.attrs.items():
            if name in attrs:
                result[name] = _normalize_value(self.name, name, spec, attrs[name])
            elif spec.default is REQUIRED:
                raise TypeInferenceError(f"{self.name}: required attribute {name!r} is missing")
            else:
                result[name] = spec.default
        return result

    def __repr__(self):
        return f"Op({self.name})"


OP_REGISTRY: dict[str, Op] = {}


def register_op(name: str, *, num_inputs, infer, reference, attrs: dict[str, AttrSpec] | None = None,
                category: str = "opaque", doc: str = "") -> Op:
    if name in OP_REGISTRY:
        raise ValueError(f"op {name!r} is registered twice")
    op = Op(name=name, num_inputs=num_inputs, attrs=dict(attrs or {}), infer=infer,
            reference=reference, category=category, doc=doc)
    OP_REGISTRY[name] = op
    return op


def get_op(name: str) -> Op:
    _ensure_ops_loaded()
    if name not in OP_REGISTRY:
        raise KeyError(f"unknown op {name!r}; registered ops: {', '.join(sorted(OP_REGISTRY))}")
    return OP_REGISTRY[name]


def list_ops() -> list[str]:
    _ensure_ops_loaded()
    return sorted(OP_REGISTRY)


def _ensure_ops_loaded():
    from .. import ops  # noqa: F401  (registers every op on import)
