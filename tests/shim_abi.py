"""The built-in shim's C ABI (backends/builtin/shim/byoc_shim.h) as the shim tests call it
through ctypes: dtype codes, argument types, tolerances. One table for the CPU and the CUDA
shim tests (test_shim_cpu.py, test_shim_cuda.py)."""
import ctypes

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
# numpy dtype -> byoc_dtype number (byoc_shim.h)
DTYPE_CODES = {
    np.dtype("float32"): 0, np.dtype("float16"): 1, BF16: 2, np.dtype("float64"): 3,
    np.dtype("int64"): 4, np.dtype("int32"): 5, np.dtype("int16"): 6, np.dtype("int8"): 7,
    np.dtype("uint8"): 8, np.dtype("bool"): 9,
}
FLOATS = ["float32", "float16", "bfloat16", "float64"]
# (rtol, atol) of arithmetic results per dtype; integers must be exact. (float64 allows for
# the norms' epsilon, which the ABI passes as a float.)
TOLERANCES = {"float32": (1e-4, 1e-5), "float16": (4e-3, 4e-3), "bfloat16": (3e-2, 3e-2), "float64": (1e-8, 1e-10)}

I64, INT, SIZE, PTR, DBL, FLT = (ctypes.c_int64, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p,
                                  ctypes.c_double, ctypes.c_float)
I64P = ctypes.POINTER(ctypes.c_int64)
# Function name -> argument types, in byoc_shim.h's order (the trailing stream included).
SIGNATURES = {
    "byoc_shim_copy_strided": [PTR, PTR, INT, INT, I64P, I64, I64P, I64P, PTR],
    "byoc_shim_tile": [PTR, PTR, INT, INT, I64P, I64P, PTR],
    "byoc_shim_gather": [PTR, PTR, PTR, INT, INT, I64, I64, I64, I64, PTR],
    "byoc_shim_gather_elements": [PTR, PTR, PTR, INT, INT, INT, I64P, I64P, INT, PTR],
    "byoc_shim_pad": [PTR, PTR, INT, INT, I64P, I64P, I64P, INT, DBL, PTR],
    "byoc_shim_trilu": [PTR, PTR, INT, I64, I64, I64, INT, I64, PTR],
    "byoc_shim_cumsum": [PTR, PTR, INT, I64, I64, I64, INT, INT, PTR],
    "byoc_shim_reduce": [PTR, PTR, INT, INT, I64, I64, I64, PTR],
    "byoc_shim_arg_reduce": [PTR, PTR, INT, INT, I64, I64, I64, INT, PTR],
    "byoc_shim_softmax": [PTR, PTR, INT, I64, I64, I64, INT, PTR],
    "byoc_shim_layer_norm": [PTR, PTR, PTR, PTR, INT, I64, I64, FLT, PTR],
    "byoc_shim_rms_norm": [PTR, PTR, PTR, INT, I64, I64, FLT, PTR],
    "byoc_shim_batch_norm": [PTR, PTR, PTR, PTR, PTR, PTR, INT, I64, I64, I64, FLT, PTR],
    "byoc_shim_matmul": [PTR, PTR, PTR, INT, I64, I64, I64, I64, INT, INT, I64, I64, I64, INT, PTR, SIZE, PTR],
    "byoc_shim_conv2d": [PTR, PTR, PTR, PTR, INT, INT] + [I64] * 16 + [PTR, SIZE, PTR],
    "byoc_shim_conv2d_workspace": [INT, INT] + [I64] * 10,
    "byoc_shim_pool2d": [PTR, PTR, INT, INT, INT] + [I64] * 16 + [INT, PTR],
}
