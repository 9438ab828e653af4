"""Types of the IR: tensor types with static shapes, and tuple types."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import ml_dtypes
import numpy as np

# The dtypes byoc knows, mapped to the NumPy dtype its reference implementations use.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype("float64"),
    "float32": np.dtype("float32"),
    "float16": np.dtype("float16"),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int64": np.dtype("int64"),
    "int32": np.dtype("int32"),
    "int16": np.dtype("int16"),
    "int8": np.dtype("int8"),
    "uint8": np.dtype("uint8"),
    "bool": np.dtype("bool"),
}
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


def dtype_of_numpy(dtype) -> str:
    """The byoc dtype name of a NumPy dtype."""
    dtype = np.dtype(dtype)
    for name, candidate in NUMPY_DTYPES.items():
        if candidate == dtype:
            return name
    raise TypeError(f"NumPy dtype {dtype} has no byoc dtype; supported: {', '.join(NUMPY_DTYPES)}")


def numpy_dtype(name: str) -> np.dtype:
    if name not in NUMPY_DTYPES:
        raise TypeError(f"unknown dtype {name!r}; supported: {', '.join(NUMPY_DTYPES)}")
    return NUMPY_DTYPES[name]


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


# Dimensions and element counts are int64 in generated code and at run time.
INT64_LIMIT = 2**63


class Type:
    """Base class of IR types.

    `nesting_depth` counts the Tuple/Fn levels of a type (0 for a tensor). It is computed
    once, when the type is made from its already-made parts, so reading it never recurses;
    the parser uses it to refuse types that printing and comparing could not handle."""

    nesting_depth = 0


def is_static_shape(dims) -> bool:
    """Whether `dims` (a list, tuple or 1-D array given for an input's shape) holds only
    non-negative integers (Python's or NumPy's, not bool): what int() may then convert
    without truncating a 4.5 or iterating a string '4,64'."""
    return isinstance(dims, (list, tuple, np.ndarray)) and all(
        isinstance(dim, (int, np.integer)) and not isinstance(dim, (bool, np.bool_)) and dim >= 0 for dim in dims)


def _nesting_depth(parts) -> int:
    # A part may be a non-Type (the None type of an ExternFunc inside a tuple).
    return 1 + max((getattr(part, "nesting_depth", 0) for part in parts), default=0)


def _checked_dimension(shape, dim) -> int:
    try:
        value = operator.index(dim)  # an int or NumPy integer; 2.5 must not become 2
    except TypeError:
        raise TypeError(f"tensor shape {shape}: dimension {dim!r} is not an integer") from None
    if isinstance(dim, (bool, np.bool_)):
        raise TypeError(f"tensor shape {shape}: dimension {dim!r} is not an integer")
    if value < 0:
        raise TypeError(f"tensor shape {shape} has a negative dimension {value}")
    if value >= INT64_LIMIT:
        raise TypeError(f"tensor shape {shape}: dimension {value} is too large; "
                        f"expected below 2**63 ({INT64_LIMIT})")
    return value


@dataclass(frozen=True)
class TensorType(Type):
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        shape = tuple(self.shape)
        object.__setattr__(self, "shape", tuple(_checked_dimension(shape, d) for d in shape))
        if self.dtype not in NUMPY_DTYPES:
            raise TypeError(f"unknown dtype {self.dtype!r}; supported: {', '.join(NUMPY_DTYPES)}")
        if math.prod(self.shape) >= INT64_LIMIT:
            raise TypeError(f"tensor shape {self.shape} has {math.prod(self.shape)} elements; "
                            f"expected fewer than 2**63 ({INT64_LIMIT})")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * NUMPY_DTYPES[self.dtype].itemsize

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[({dims}), {self.dtype}]"


@dataclass(frozen=True)
class TupleType(Type):
    fields: tuple[Type, ...]

    def __post_init__(self):
        object.__setattr__(self, "fields", tuple(self.fields))
        object.__setattr__(self, "nesting_depth", _nesting_depth(self.fields))

    def __str__(self) -> str:
        return "Tuple[" + ", ".join(str(f) for f in self.fields) + "]"


@dataclass(frozen=True)
class FuncType(Type):
    params: tuple[Type, ...]
    ret: Type

    def __post_init__(self):
        object.__setattr__(self, "nesting_depth", _nesting_depth((*self.params, self.ret)))

    def __str__(self) -> str:
        return "Fn[(" + ", ".join(str(p) for p in self.params) + f"), {self.ret}]"
