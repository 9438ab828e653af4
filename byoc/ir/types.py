"""Types of the IR: tensor types with static shapes, and tuple types."""
from __future__ import annotations

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


class Type:
    """Base class of IR types."""


@dataclass(frozen=True)
class TensorType(Type):
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in NUMPY_DTYPES:
            raise TypeError(f"unknown dtype {self.dtype!r}; supported: {', '.join(NUMPY_DTYPES)}")
        if any(d < 0 for d in self.shape):
            raise TypeError(f"tensor shape {self.shape} has a negative dimension")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

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

    def __str__(self) -> str:
        return "Tuple[" + ", ".join(str(f) for f in self.fields) + "]"


@dataclass(frozen=True)
class FuncType(Type):
    params: tuple[Type, ...]
    ret: Type

    def __str__(self) -> str:
        return "Fn[(" + ", ".join(str(p) for p in self.params) + f"), {self.ret}]"
