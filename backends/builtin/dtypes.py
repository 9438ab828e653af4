"""Dtype tables of the built-in backend's generated code: C types, shim enum names and
C literals. Tables, not if-chains, so that adding a dtype is adding a row."""
from __future__ import annotations

import math

import numpy as np

from ...ir.types import numpy_dtype

# byoc dtype -> the byoc_dtype enumerator of byoc_shim.h
SHIM_DTYPES = {
    "float32": "BYOC_FLOAT32", "float16": "BYOC_FLOAT16", "bfloat16": "BYOC_BFLOAT16",
    "float64": "BYOC_FLOAT64", "int64": "BYOC_INT64", "int32": "BYOC_INT32",
    "int16": "BYOC_INT16", "int8": "BYOC_INT8", "uint8": "BYOC_UINT8", "bool": "BYOC_BOOL",
}

# byoc dtype -> the C type elements are stored as in memory, per target.
STORAGE_TYPES = {
    "cpu": {"float16": "uint16_t", "bfloat16": "uint16_t"},
    "cuda": {"float16": "__half", "bfloat16": "__nv_bfloat16"},
}
_COMMON_STORAGE = {
    "float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t",
    "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "bool",
}

# byoc dtype -> the C type values are computed in: 16-bit floats widen to float (and are
# rounded back after every op, as the references do), everything else computes as itself.
COMPUTE_TYPES = {
    "float32": "float", "float16": "float", "bfloat16": "float", "float64": "double",
    "int64": "int64_t", "int32": "int32_t", "int16": "int16_t", "int8": "int8_t",
    "uint8": "uint8_t", "bool": "bool",
}

# Integer dtype -> the unsigned type its wrapping arithmetic goes through (signed overflow
# is undefined in C; narrower types go through uint32_t, because uint16_t * uint16_t
# promotes to a signed int that can overflow).
WRAPPING_TYPES = {
    "int64": "uint64_t", "int32": "uint32_t", "int16": "uint32_t", "int8": "uint32_t",
    "uint8": "uint32_t",
}

SIXTEEN_BIT_FLOATS = ("float16", "bfloat16")


def storage_type(dtype: str, target_kind: str) -> str:
    return STORAGE_TYPES[target_kind].get(dtype) or _COMMON_STORAGE[dtype]


def element_size(dtype: str) -> int:
    return numpy_dtype(dtype).itemsize


def is_float(dtype: str) -> bool:
    return COMPUTE_TYPES[dtype] in ("float", "double")


def is_signed_int(dtype: str) -> bool:
    return dtype in ("int64", "int32", "int16", "int8")


def int_literal(value: int) -> str:
    """A C literal of any int64/uint64 value (INT64_MIN has no literal of its own)."""
    value = int(value)
    if value == -(2 ** 63):
        return "(-9223372036854775807LL - 1)"
    if -(2 ** 31) < value < 2 ** 31:
        return str(value)
    return f"{value}LL" if value < 2 ** 63 else f"{value}ULL"


def float_literal(value: float, c_type: str = "double") -> str:
    """A C expression of type `c_type` with exactly `value` rounded to it once: the
    shortest repr of the double, cast (infinities and NaN by name, from <cmath>)."""
    value = float(value)
    if math.isnan(value):
        text = "NAN"
    elif math.isinf(value):
        text = "INFINITY" if value > 0 else "-INFINITY"
    else:
        text = repr(value)
    return f"({c_type})({text})"


def value_literal(value, dtype: str) -> str:
    """A C literal of `value` (a NumPy scalar of `dtype`) in dtype's compute type."""
    compute = COMPUTE_TYPES[dtype]
    if dtype == "bool":
        return "true" if bool(value) else "false"
    if is_float(dtype):
        # float() of any float dtype is exact; the cast to the compute type is exact too.
        return float_literal(float(np.asarray(value).astype(np.float64)), compute)
    return f"({compute})({int_literal(int(value))})"
