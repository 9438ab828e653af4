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
    "byoc_shim_concat": [ctypes.POINTER(PTR), INT, I64P, I64, PTR, PTR],
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
    "byoc_shim_squeeze_excitation": [PTR] * 6 + [INT, I64, I64, I64, I64, INT, FLT, FLT, INT, FLT, FLT, INT, PTR],
}

# byoc_activation (byoc_shim.h): name -> number
ACTIVATIONS = {"identity": 0, "relu": 1, "silu": 2, "hard_swish": 3, "sigmoid": 4, "hard_sigmoid": 5}

# byoc_shim_squeeze_excitation's cases: (batch, pixels, channels, squeeze, activation, gate,
# biases). Channels not a power of two; 32 channels over 3136 pixels (many threads per
# channel vector); 4096 channels (several vectors per thread); squeezes read as vectors
# (48, 240) and as single values (10, 20, 1).
SQUEEZE_EXCITATION_CASES = [
    (3, 63, 40, 10, "relu", "hard_sigmoid", True),
    (2, 49, 1152, 48, "silu", "sigmoid", True),
    (2, 7, 960, 240, "relu", "hard_sigmoid", True),
    (1, 3136, 32, 8, "silu", "sigmoid", True),
    (2, 5, 4096, 20, "hard_swish", "sigmoid", False),
    (4, 1, 16, 1, "identity", "identity", False),
]


def squeeze_excitation_inputs(rng, batch, pixels, channels, squeeze, dtype, biases):
    """(x, w1, b1, w2, b2) of one case, weights scaled by their fan-in so that the gates vary."""
    def draw(shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dtype)
    x = draw((batch, pixels, channels))
    w1, w2 = draw((squeeze, channels), 3 / np.sqrt(channels)), draw((channels, squeeze), 2 / np.sqrt(squeeze))
    b1, b2 = (draw((squeeze,)), draw((channels,))) if biases else (None, None)
    return x, w1, b1, w2, b2


def squeeze_excitation_reference(x, w1, b1, w2, b2, activation, gate, alpha=1 / 6, beta=0.5,
                                 scale=False) -> np.ndarray:
    """The gate byoc_shim.h defines, in float64, as x's dtype; with `scale`, x times it
    (the gate rounded to x's dtype first, as the shims do)."""
    functions = {"identity": lambda v: v, "relu": lambda v: np.maximum(v, 0),
                 "silu": lambda v: v / (1 + np.exp(-v)), "hard_swish": lambda v: v * np.clip(v / 6 + 0.5, 0, 1),
                 "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "hard_sigmoid": lambda v: np.clip(alpha * v + beta, 0, 1)}
    def wide(a):
        return None if a is None else a.astype(np.float64)
    pooled = wide(x).mean(axis=1)
    hidden = functions[activation](pooled @ wide(w1).T + (0 if b1 is None else wide(b1)))
    gates = functions[gate](hidden @ wide(w2).T + (0 if b2 is None else wide(b2))).astype(x.dtype)
    return (wide(x) * wide(gates)[:, None, :]).astype(x.dtype) if scale else gates
