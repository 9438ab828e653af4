"""Fused multi-head attention: what one attention partition computes, read off its ops, and
the kernel that runs it.

The chain (BERT's self-attention as exporters write it, after LowerSplit):

    q = transpose(reshape(Q, [B, Sq, H, D]), [0, 2, 1, 3])          Q: [.., H*D], or a last-axis
    k = transpose(reshape(K, [B, Sk, H, D]), [0, 2, 3, 1])             slice of a fused QKV
        (or transpose(transpose(reshape(K, ..), [0, 2, 1, 3]), [0, 1, 3, 2]))
    v = transpose(reshape(V, [B, Sk, H, Dv]), [0, 2, 1, 3])
    s = matmul(q, k) [* c | / c] [+ mask]           mask broadcasts to [B, H, Sq, Sk]
    p = softmax(s, axis=-1) [then where(isnan(p), 0, p): a row of only -inf gives zeros]
    o = matmul(p, v)
    out = [reshape(] transpose(o, [0, 2, 1, 3]) [, [B, Sq, H*Dv])]

where reshape(X, [B, S, H, D]) may also be a [B, S, H, D] value from outside the chain,
read as rows of H*D; a head split (q, k before its transpose, v) may also be a [B, H, S, D]
value computed outside (rotary position embeddings applied to the heads), read in place;
and K's and V's heads may be repeated for grouped-query attention, as transformers'
repeat_kv writes it:

    reshape(broadcast_to(expand_dims(kv, axes=[2]), [B, Hkv, G, S, D]), [B, Hkv*G, S, D])

then query head h reads key/value head h // G in place (no repeated copy).

runs as one kernel that reads Q, K and V in place through row, head and batch strides (out
of the fused QKV projection when they are its slices), keeps the scores on chip, and writes
[B, Sq, H, Dv] directly: the head-split copies, both batched GEMMs, the mask add and the
softmax of the unfused chain are gone. Two kernels: byoc's flash attention
(include/byoc_flash_attention.cuh: FlashAttention-2's schedule on CUTLASS's sm80 MMA, ldmatrix
and cp.async atoms) for head dims of 64 and 128, and otherwise CUTLASS's fused multi-head
attention (examples/41_fused_multi_head_attention in the nvidia-cutlass package: xformers'
memory-efficient attention, a CUTLASS 2.x Sm80 kernel that also runs on sm_90).

`read_attention` walks the chain back from its output through a `producer` lookup, so the
pattern check (over a Match) and codegen (over a partition's flattened ops) read it alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from byoc.ir.expr import Constant
from byoc.ops.layout import transpose_keeps_order

# The kernel's vector loads are 16 bytes: every pointer offset and stride (in elements of
# a 16-bit type) must be a multiple of 8.
ALIGNMENT = 8
MAX_HEAD_DIM = 128  # one pass over the values per key block (no float accumulator buffer)
HEAD_SPLIT = (0, 2, 1, 3)
KEY_TRANSPOSE = (0, 2, 3, 1)
LAST_TWO_SWAP = (0, 1, 3, 2)


class NotAttention(Exception):
    """The chain is not one the kernel runs; the message says why."""


@dataclass(frozen=True)
class Operand:
    """Where Q, K or V is read: `source` (the leaf expression; a partition parameter), the
    element offset of the first row (a slice's start), the row stride (the source's last
    dimension), and the head and batch strides where the rows are not [B, S, H, D]
    (None: head_dim and row_stride * seq, the rows of a projection)."""
    source: object
    offset: int
    row_stride: int
    head_stride: int | None = None
    batch_stride: int | None = None


@dataclass(frozen=True)
class Attention:
    batch: int
    heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int
    dtype: str
    scale: float
    q: Operand
    k: Operand
    v: Operand
    mask: object = None  # leaf expression of the additive mask, or None
    mask_strides: tuple = ()  # (batch, head, query) strides in elements; keys are contiguous
    # the probabilities are guarded: where(isnan(p), 0, p), so a row whose every key is
    # masked with -inf gives zeros (not NaN); byoc's flash kernel has that mode
    zero_empty_rows: bool = False
    # query heads per key/value head (grouped-query attention); byoc's flash kernel only
    kv_group: int = 1
    # mask strides that are not multiples of 8 elements (a sequence of 77 tokens): byoc's
    # flash kernel reads the mask an element at a time; the example 41 kernel cannot
    mask_unaligned: bool = False

    @property
    def flash_only(self) -> bool:
        """Whether only byoc's flash kernel runs this problem (read_attention checked it can)."""
        return self.zero_empty_rows or self.kv_group > 1 or self.mask_unaligned

    def kernel(self, sm_count: int, tile: str = "") -> "AttentionKernel":
        """The kernel for this problem: `tile` (the cutlass target's attention_tile:
        EXAMPLE_TILES, FLASH_TILES) where given and the kernel takes the problem, else by
        size (AttentionKernel.for_problem)."""
        return AttentionKernel.for_problem(self, sm_count, tile)


# byoc's flash attention kernel (include/byoc_flash_attention.cuh) takes head dims of 32,
# 64 and 128 with V's equal to Q's; other problems go to CUTLASS's example 41 kernel.
FLASH_HEAD_DIMS = (32, 64, 128)
# attention_tile values: CUTLASS's example 41 kernel's blocks, and the flash kernel's
# ("flash:" queries x keys; 16 queries a warp)
EXAMPLE_TILES = ("64x64", "32x128")
FLASH_TILES = ("flash:64x64", "flash:32x64", "flash:64x128", "flash:32x128")


@dataclass(frozen=True)
class AttentionKernel:
    """One attention kernel: queries x keys per thread block, and either byoc's flash
    kernel (`flash`: head dim `max_k` exactly) or an instantiation of CUTLASS's example 41
    AttentionKernel (kMaxK = `max_k`, the bound on the head dims: a single pass over V
    when kMaxK <= keys)."""
    queries: int
    keys: int
    max_k: int
    flash: bool = False

    @staticmethod
    def for_problem(problem: Attention, sm_count: int, tile: str = "") -> "AttentionKernel":
        flash_fits = problem.head_dim == problem.head_dim_v and problem.head_dim in FLASH_HEAD_DIMS
        if problem.flash_only and not tile.startswith("flash:"):
            tile = ""
        if tile.startswith("flash:") and flash_fits:
            queries, keys = (int(n) for n in tile[len("flash:"):].split("x"))
            return AttentionKernel(queries, keys, problem.head_dim, flash=True)
        max_k = 64 if max(problem.head_dim, problem.head_dim_v) <= 64 else 128
        if tile == "32x128" or (tile == "64x64" and max_k > 64):
            return AttentionKernel(32, 128, max_k)
        if tile == "64x64":
            return AttentionKernel(64, 64, max_k)
        if flash_fits and not tile:
            return AttentionKernel.flash_for(problem, sm_count)
        blocks_64 = math.ceil(problem.seq_q / 64) * problem.heads * problem.batch
        # 32 queries x 128 keys where the keys fit one block: one pass over them, and twice
        # the blocks (BERT-base at batch 8, seq 128: 0.745 -> 0.713 ms a run on an H100 against
        # 64x64's two passes); else 64 queries a block (4 warps over a 64x64 tile) when that
        # fills the GPU (ViT's 197 keys at batch 8); else 32x128, twice the blocks.
        if problem.seq_k <= 128:
            return AttentionKernel(32, 128, max_k)
        if max_k == 64 and blocks_64 >= sm_count:
            return AttentionKernel(64, 64, max_k)
        return AttentionKernel(32, 128, max_k)

    @staticmethod
    def flash_for(problem: Attention, sm_count: int) -> "AttentionKernel":
        """The flash kernel's blocks, from bench/bench_attention.py on an H100 (every tile,
        bench/results/attention.md): 64 queries (4 warps) a block won on every shape, even
        where 32 would give twice the blocks (BERT-base at batch 1: 24 blocks of 64); 128 keys
        a pass where that is all the keys (one pass, no rescaling: BERT at 128 tokens 4.98 us
        against 5.37 for 64) or the head dim is 128 (10.8 us against 12.1 at 256 keys), else
        64 (ViT's 197 keys: 13.5 us against 18.6 for 128); 64 where that is all the keys
        (Swin's windows of 49: one pass either way, half the padded keys)."""
        if problem.seq_k <= 64:
            return AttentionKernel(64, 64, problem.head_dim, flash=True)
        keys = 128 if problem.seq_k <= 128 or problem.head_dim == 128 else 64
        return AttentionKernel(64, keys, problem.head_dim, flash=True)

    @property
    def template(self) -> str:
        return "cutlass/flash_attention.cu.j2" if self.flash else "cutlass/attention_sm80.cu.j2"

    def name(self, problem: Attention) -> str:
        dtype = {"float16": "f16", "bfloat16": "bf16"}[problem.dtype]
        mask = "_mask" if problem.mask is not None else ""
        if self.flash:
            guard = "_zero_empty_rows" if problem.zero_empty_rows else ""
            group = f"_gqa{problem.kv_group}" if problem.kv_group > 1 else ""
            return f"byoc_flash_attention_sm80_{dtype}_{self.queries}x{self.keys}_d{self.max_k}{mask}{guard}{group}"
        return f"cutlass_fmha_sm80_{dtype}_{self.queries}x{self.keys}_k{self.max_k}{mask}"


def _axes(attrs, rank) -> tuple:
    return tuple(int(a) % rank for a in attrs["axes"])


def read_attention(root, producer) -> Attention:
    """The Attention the chain ending at `root` computes. `producer(expr)` gives
    (op name, args, attrs) of the op that computed expr, or None for a leaf (an input of
    the match / a parameter of the partition). Raises NotAttention with the reason."""
    def op(expr, name):
        made = producer(expr)
        if made is None or made[0] != name:
            return None
        return made

    node = root
    if op(node, "reshape"):
        node = producer(node)[1][0]
    made = op(node, "transpose")
    if made is None or _axes(made[2], 4) != HEAD_SPLIT:
        raise NotAttention("the context is not transposed back to [B, S, H, D]")
    made = op(made[1][0], "matmul")
    if made is None:
        raise NotAttention("no probabilities @ V matmul")
    probabilities, values = made[1]
    zero_empty_rows = False
    made = op(probabilities, "where")
    if made is not None:
        probabilities = _guarded_probabilities(made[1], producer)
        zero_empty_rows = True
    made = op(probabilities, "softmax")
    if made is None:
        raise NotAttention("no softmax before the second matmul")
    if int(made[2].get("axis", -1)) % 4 != 3:
        raise NotAttention(f"softmax over axis {made[2].get('axis')}, not the keys (last axis)")
    scores = made[1][0]
    mask = None
    made = op(scores, "add")
    if made is not None:
        left, right = made[1]
        scores, mask = (left, right) if _computes_scores(left, producer) else (right, left)
    scale = 1.0
    for name in ("divide", "multiply"):
        made = op(scores, name)
        if made is None:
            continue
        first, second = made[1]
        constant = second if isinstance(second, Constant) else first if name == "multiply" else None
        if not isinstance(constant, Constant) or constant.type.size != 1:
            raise NotAttention(f"scores {name} by a non-scalar")
        value = float(np.asarray(constant.data, np.float64).reshape(-1)[0])
        if not np.isfinite(value) or (name == "divide" and value == 0.0):
            raise NotAttention(f"scale {value} is not a finite, nonzero number")
        scale = 1.0 / value if name == "divide" else value
        scores = made[1][0] if constant is second else made[1][1]
    made = op(scores, "matmul")
    if made is None:
        raise NotAttention("no Q @ K^T matmul")
    queries, keys_t = made[1]
    q = _heads(queries, producer, "Q", repeats=False)
    k = _key_heads(keys_t, producer)
    v = _heads(values, producer, "V")
    (batch, seq_q, heads, head_dim), q_operand, _ = q
    (k_batch, seq_k, k_heads, k_dim), k_operand, k_group = k
    (v_batch, v_seq, v_heads, head_dim_v), v_operand, v_group = v
    # one key/value head broadcast by the matmuls to every query head (multi-query
    # attention as scaled_dot_product_attention exports it: no repeat_kv): a group of all
    if k_heads == 1 and k_group == 1:
        k_group = heads
    if v_heads == 1 and v_group == 1:
        v_group = heads
    if (k_batch, k_heads * k_group, k_dim) != (batch, heads, head_dim) or \
            (v_batch, v_seq, v_heads * v_group) != (batch, seq_k, heads) or k_group != v_group:
        raise NotAttention(f"Q {q[0]}, K {k[0]} repeated {k_group} times and V {v[0]} repeated {v_group} times "
                           f"(as [B, S, H, D]) do not agree")
    dtype = root.type.dtype
    if dtype not in ("float16", "bfloat16"):
        raise NotAttention(f"dtype {dtype} (the fused attention kernel takes float16 or bfloat16)")
    if max(head_dim, head_dim_v) > MAX_HEAD_DIM:
        raise NotAttention(f"head dim {max(head_dim, head_dim_v)} > {MAX_HEAD_DIM}")
    for name, value in (("head dim", head_dim), ("value head dim", head_dim_v)):
        if value % ALIGNMENT:
            raise NotAttention(f"{name} {value} not a multiple of {ALIGNMENT} (16-byte loads)")
    for name, operand in (("Q", q_operand), ("K", k_operand), ("V", v_operand)):
        if operand.source.type.dtype != dtype:
            raise NotAttention(f"{name} is {operand.source.type.dtype}, the output {dtype}")
        if operand.offset % ALIGNMENT or operand.row_stride % ALIGNMENT:
            raise NotAttention(f"{name} slice at {operand.offset} with row stride {operand.row_stride}: "
                               f"not multiples of {ALIGNMENT} (16-byte loads)")
    flash_fits = head_dim == head_dim_v and head_dim in FLASH_HEAD_DIMS
    if zero_empty_rows and not flash_fits:
        raise NotAttention(f"probabilities guarded against NaN (a row with every key masked gives zeros): only "
                           f"byoc's flash kernel has that mode, for head dims {FLASH_HEAD_DIMS}, not {head_dim}")
    if k_group > 1 and not flash_fits:
        raise NotAttention(f"grouped-query attention ({k_group} query heads a key/value head): only byoc's flash "
                           f"kernel reads shared heads, for head dims {FLASH_HEAD_DIMS}, not {head_dim}")
    mask_strides, mask_unaligned = (), False
    if mask is not None:
        mask_strides = _mask_strides(mask, (batch, heads, seq_q, seq_k), dtype)
        unaligned = [name for name, stride in zip(("batch", "head", "query"), mask_strides) if stride % ALIGNMENT]
        if unaligned and not flash_fits:
            raise NotAttention(f"mask {unaligned[0]} stride {mask_strides[('batch', 'head', 'query').index(unaligned[0])]} "
                               f"not a multiple of {ALIGNMENT}: only byoc's flash kernel reads such a mask, for head "
                               f"dims {FLASH_HEAD_DIMS}, not {head_dim}")
        mask_unaligned = bool(unaligned)
    return Attention(batch, heads, seq_q, seq_k, head_dim, head_dim_v, dtype, scale,
                     q_operand, k_operand, v_operand, mask, mask_strides, zero_empty_rows, k_group, mask_unaligned)


def _guarded_probabilities(args, producer):
    """p of where(p != p, 0, p) (NaN probabilities as zeros), else NotAttention."""
    condition, zero, probabilities = args
    test = producer(condition)
    if test is None or test[0] != "not_equal" or not (test[1][0] is probabilities and test[1][1] is probabilities):
        raise NotAttention("the probabilities pass through a where other than where(isnan(p), 0, p)")
    if not isinstance(zero, Constant) or zero.type.size != 1 or \
            float(np.asarray(zero.data, np.float64).reshape(-1)[0]) != 0.0:
        raise NotAttention("NaN probabilities are replaced by something other than 0")
    return probabilities


def _computes_scores(expr, producer) -> bool:
    """Whether expr is Q @ K^T, possibly scaled (the other addend is the mask)."""
    made = producer(expr)
    if made is not None and made[0] in ("divide", "multiply"):
        made = next((producer(a) for a in made[1] if producer(a) is not None), None)
    return made is not None and made[0] == "matmul"


def _heads(expr, producer, role, repeats=True):
    """The heads [B, H, S, D] that `expr` is -> ((B, S, H, D), Operand, G): a head split
    transpose(reshape(source, [B, S, H, D]), [0, 2, 1, 3]) of a projection, a [B, H, S, D]
    value from outside the chain read in place (also through reshapes and unit-axis
    transposes that keep its element order: _same_order_leaf), or (where `repeats`) either
    of those with each head repeated G times (grouped-query attention; G is 1 otherwise;
    read_attention makes one head that the matmuls broadcast a group of every query head)."""
    made = producer(expr)
    leaf = _same_order_leaf(expr, producer)
    if leaf is not None and len(expr.type.shape) == 4:
        # heads from outside, or their elements in the same order under another shape (K
        # after rotary embeddings is [B, H, S, 2, D/2]; one head moved by a transpose)
        batch, heads, seq, dim = expr.type.shape
        return (batch, seq, heads, dim), Operand(leaf, 0, dim, seq * dim, heads * seq * dim), 1
    if repeats and made is not None and made[0] == "reshape":
        return _repeated_heads(expr, made[1][0], producer, role)
    if made is None or made[0] != "transpose" or _axes(made[2], 4) != HEAD_SPLIT:
        raise NotAttention(f"{role} is not split into heads by transpose [0, 2, 1, 3]")
    return (*_reshaped_source(made[1][0], producer, role), 1)


def _same_order_leaf(expr, producer):
    """The leaf (a value from outside the chain) whose elements `expr` holds in the same
    order, through reshapes and transposes that move only axes of size 1; else None."""
    while True:
        made = producer(expr)
        if made is None:
            return expr
        if made[0] == "reshape":
            expr = made[1][0]
            continue
        if made[0] == "transpose" and transpose_keeps_order(made[1][0].type.shape, made[2].get("axes")):
            expr = made[1][0]
            continue
        return None


def _repeated_heads(expr, repeated, producer, role):
    """reshape(broadcast_to(expand_dims(kv, [2]), [B, Hkv, G, S, D]), [B, Hkv*G, S, D]):
    kv's heads, each read by G query heads."""
    made = producer(repeated)
    if made is None or made[0] != "broadcast_to" or len(repeated.type.shape) != 5:
        raise NotAttention(f"{role}'s heads are reshaped from something other than repeated heads")
    expanded = producer(made[1][0])
    if expanded is None or expanded[0] != "expand_dims" or tuple(int(a) for a in expanded[2]["axes"]) != (2,):
        raise NotAttention(f"{role}'s heads are repeated other than along a new axis 2 (repeat_kv)")
    batch, kv_heads, group, seq, dim = repeated.type.shape
    if tuple(expr.type.shape) != (batch, kv_heads * group, seq, dim):
        raise NotAttention(f"{role}'s repeated heads {tuple(repeated.type.shape)} are reshaped to "
                           f"{tuple(expr.type.shape)}, not [B, Hkv*G, S, D]")
    shape, operand, inner_group = _heads(expanded[1][0], producer, role, repeats=False)
    return shape, operand, group * inner_group


def _key_heads(expr, producer):
    made = producer(expr)
    if made is None or made[0] != "transpose":
        raise NotAttention("K^T is not a transpose of K's heads")
    axes = _axes(made[2], 4)
    if axes == KEY_TRANSPOSE:
        return (*_reshaped_source(made[1][0], producer, "K"), 1)
    if axes == LAST_TWO_SWAP:
        return _heads(made[1][0], producer, "K")
    raise NotAttention(f"K^T transposes with axes {axes}")


def _reshaped_source(expr, producer, role):
    made = producer(expr)
    if made is None and len(expr.type.shape) == 4:  # [B, S, H, D] from outside: rows of H*D
        batch, seq, heads, dim = expr.type.shape
        return (batch, seq, heads, dim), Operand(expr, 0, heads * dim)
    if made is None or made[0] != "reshape" or len(expr.type.shape) != 4:
        raise NotAttention(f"{role} is not reshaped to [B, S, H, D]")
    batch, seq, heads, dim = expr.type.shape
    source = made[1][0]
    if source.type.shape[-1] != heads * dim:
        raise NotAttention(f"{role}'s rows of {source.type.shape[-1]} are not H*D = {heads}*{dim}")
    sliced = producer(source)
    if sliced is None:
        return (batch, seq, heads, dim), Operand(source, 0, heads * dim)
    if sliced[0] != "strided_slice":
        raise NotAttention(f"{role} is computed by {sliced[0]} inside the partition")
    from byoc.ops.layout import _slices
    whole = sliced[1][0]
    if producer(whole) is not None:
        raise NotAttention(f"{role}'s slice reads a value computed inside the partition")
    attrs = sliced[2]
    slices, _ = _slices(whole.type.shape, attrs["begin"], attrs["end"], attrs["axes"], attrs["strides"])
    *outer, last = slices
    outer_whole = all(s == slice(None) or (s.start == 0 and s.step == 1) for s in outer) and \
        tuple(whole.type.shape[:-1]) == tuple(source.type.shape[:-1])
    if not outer_whole or last.step != 1:
        raise NotAttention(f"{role} is a slice other than a contiguous range of the last axis")
    return (batch, seq, heads, dim), Operand(whole, int(last.start), int(whole.type.shape[-1]))


def _mask_strides(mask, shape, dtype) -> tuple:
    """(batch, head, query) element strides of the mask broadcast to `shape` ([B, H, Sq, Sk])."""
    mask_shape = tuple(mask.type.shape)
    if mask.type.dtype != dtype:
        raise NotAttention(f"mask is {mask.type.dtype}, the scores {dtype}")
    if len(mask_shape) > 4:
        raise NotAttention(f"mask of rank {len(mask_shape)}")
    padded = (1,) * (4 - len(mask_shape)) + mask_shape
    for size, full in zip(padded, shape):
        if size not in (1, full):
            raise NotAttention(f"mask of shape {mask_shape} does not broadcast to {shape}")
    if padded[3] != shape[3]:
        raise NotAttention(f"mask of shape {mask_shape} is broadcast along the keys")
    strides, step = [], 1
    for size in reversed(padded):
        strides.append(step if size > 1 else 0)
        step *= size
    batch_stride, head_stride, query_stride, _ = reversed(strides)
    return batch_stride, head_stride, query_stride


def template_data(problem: Attention, kernel: AttentionKernel, symbol: str, index_of) -> dict:
    """What kernel.template renders; index_of(expr) -> parameter index."""
    element = {"float16": "cutlass::half_t", "bfloat16": "cutlass::bfloat16_t"}[problem.dtype]

    def operand(o: Operand, head_dim, seq):
        return {"index": index_of(o.source), "offset": o.offset, "row_stride": o.row_stride,
                "head_stride": head_dim if o.head_stride is None else o.head_stride,
                "batch_stride": o.row_stride * seq if o.batch_stride is None else o.batch_stride}

    data = {
        "symbol": symbol, "kernel_name": kernel.name(problem), "element": element,
        "queries": kernel.queries, "keys": kernel.keys, "max_k": kernel.max_k,
        "batch": problem.batch, "heads": problem.heads, "seq_q": problem.seq_q, "seq_k": problem.seq_k,
        "head_dim": problem.head_dim, "head_dim_v": problem.head_dim_v, "scale": f"{problem.scale!r}f",
        "q": operand(problem.q, problem.head_dim, problem.seq_q),
        "k": operand(problem.k, problem.head_dim, problem.seq_k),
        "v": operand(problem.v, problem.head_dim_v, problem.seq_k), "has_mask": problem.mask is not None,
        "zero_empty_rows": problem.zero_empty_rows, "kv_group": problem.kv_group,
    }
    if problem.mask is not None:
        data["mask"] = {"index": index_of(problem.mask), "batch_stride": problem.mask_strides[0],
                        "head_stride": problem.mask_strides[1], "query_stride": problem.mask_strides[2]}
    return data
