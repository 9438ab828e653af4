"""CUTLASS GEMM kernels as data: a configuration (arch, dtype, tile, cluster or warp
shape, stages, schedule) whose name spells it, the problem it runs (M, N, K, batch,
layout of B, epilogue), and the candidates the tuner chooses among.

    cutlass_sm90_f16_128x256x64_1x2_coop_bias_gelu
    cutlass_sm90_f16_128x128x64_1x1_coop_splitk4_nt_plain
    cutlass_sm80_bf16_128x128x32_64x64x32_3stage_residual

The cutlass Target narrows the candidates (CandidateFilter: tiles, clusters, stages) and
may add (split_k, off by default) sm90 kernels that split K, split-K and stream-K, which
only tuning picks (a database entry that splits is used either way: it was measured). Measured on an H100 they lose to the unsplit tiles at M=1024
(backends/cutlass/tuning_sm90.json) and, when a heuristic picked split-K for the batch-1
GEMMs whose tiles leave most SMs idle, whole models got slower (bench/results/models.md,
rows cuda_sm90:split), so the heuristic never splits.

Templates (templates/cutlass/gemm_sm90.cu.j2, gemm_sm80.cu.j2) receive `type_data()`, plain
values that depend on the kernel's types only; a partition's sizes (`call_sizes()`) reach
the kernel at run time (backends/cutlass/include/byoc_cutlass_call.h).
"""
from __future__ import annotations

from dataclasses import dataclass

ELEMENTS = {"float16": ("f16", "cutlass::half_t"), "bfloat16": ("bf16", "cutlass::bfloat16_t")}
ELEMENT_BITS = {"float16": 16, "bfloat16": 16}
# epilogue activation name in byoc -> CUTLASS activation functor
ACTIVATIONS = {None: "Identity", "relu": "ReLu", "gelu": "GELU", "gelu_tanh": "GELU_taylor",
               "silu": "SiLu", "sigmoid": "Sigmoid", "hard_swish": "HardSwish"}
# A runtime-epilogue kernel's problem has this activation (kernels.runtime_problem): its
# functor (include/byoc_runtime_activation.h) applies the call's, by these codes
RUNTIME_ACTIVATION = "runtime"
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4, "sigmoid": 5, "hard_swish": 6}


def activation_functor(activation) -> str:
    """The CUTLASS activation functor a template names for `activation`."""
    if activation == RUNTIME_ACTIVATION:
        return "byoc_cutlass::RuntimeActivation"
    return f"cutlass::epilogue::thread::{ACTIVATIONS[activation]}"


@dataclass(frozen=True)
class GemmProblem:
    """What one partition computes: D = act(A @ B + bias) + residual, batched over L, or
    with residual_in_activation D = act(A @ B + bias + residual) (a pointwise conv's epilogue:
    ResNet's relu(conv + shortcut))."""
    m: int
    n: int
    k: int
    batch: int
    dtype: str  # float16 | bfloat16
    b_transposed: bool  # B is stored N x K (K contiguous)
    activation: str | None = None
    has_bias: bool = False
    has_residual: bool = False
    # D = alpha * (A @ B) ...: a scalar scale folded into the epilogue (attention's
    # 1/sqrt(d)). It changes no kernel choice, so it is not part of the tuning key.
    alpha: float = 1.0
    residual_in_activation: bool = False

    @property
    def epilogue_name(self) -> str:
        """The epilogue's steps in order: bias_gelu_residual, bias_residual_relu, plain."""
        residual = ["residual"] if self.has_residual else []
        activation = [self.activation] if self.activation else []
        steps = residual + activation if self.residual_in_activation else activation + residual
        return "_".join((["bias"] if self.has_bias else []) + steps) or "plain"

    @property
    def key(self) -> str:
        """The tuning-database key: everything the choice of kernel depends on."""
        return (f"{self.dtype}:m{self.m}:n{self.n}:k{self.k}:l{self.batch}:"
                f"{'nt' if self.b_transposed else 'nn'}:{self.epilogue_name}")


# What CUTLASS's can_implement asks of a problem's sizes, as data, so that no kernel is chosen
# (by the heuristic, the tuner or a tuning-database entry) that would refuse its operands at
# run time. Every template instantiates its kernel with 128-bit accesses (kAlignment = 128 /
# element bits; on sm_90 also TMA's 16-byte rule): a tensor's contiguous extent and each of
# its strides must be a multiple of that many elements. byoc's operands are packed, so every
# stride (leading dimension, batch stride) is a multiple of the contiguous extent, and the one
# rule on that extent is CUTLASS's check of the extent and of every stride.
ACCESS_BITS = 128
# the templates read a problem's extents as int
INT32_MAX = (1 << 31) - 1
# gridDim.y and gridDim.z of a launch (sm_80's GemmUniversalBase::can_implement checks them;
# a non-persistent sm_90 kernel launches one CTA per tile and would fail to launch past them)
GRID_YZ_MAX = (1 << 16) - 1


def access_elements(dtype: str) -> int:
    """Elements of one 128-bit access: 8 for float16 and bfloat16."""
    return ACCESS_BITS // ELEMENT_BITS[dtype]


def dtype_flaw(dtype: str) -> str | None:
    if dtype not in ELEMENTS:
        return f"dtype {dtype} (the kernels take {' or '.join(ELEMENTS)})"
    return None


def extents_flaw(extents: dict) -> str | None:
    """Why `extents` (name -> value) cannot be a kernel's: each positive and an int."""
    for name, value in extents.items():
        if not 0 < value <= INT32_MAX:
            return f"{name}={value} is not a positive 32-bit extent"
    return None


def alignment_flaw(operand: str, extent_name: str, extent: int, dtype: str) -> str | None:
    """CUTLASS's check_alignment of a packed operand whose contiguous extent is `extent`."""
    elements = access_elements(dtype)
    if extent % elements:
        return (f"{extent_name}={extent} is not a multiple of {elements} (16-byte accesses of {dtype} along "
                f"{extent_name}, the contiguous extent of {operand})")
    return None


def gemm_operands(problem: "GemmProblem") -> list:
    """(operand, name of its contiguous extent, extent) of each tensor a GEMM kernel reads or
    writes, as the templates lay them out: A row-major M x K; B N x K (nt) or K x N (nn); the
    residual C and D row-major M x N; the bias a vector of N (sm_90: a per-column broadcast;
    sm_80: C with a zero row stride). Operand-swapped kernels read the same bytes."""
    operands = [("A, row-major M x K", "K", problem.k),
                ("B, N x K (nt)", "K", problem.k) if problem.b_transposed else ("B, K x N (nn)", "N", problem.n),
                ("D, row-major M x N", "N", problem.n)]
    if problem.has_residual:
        operands.append(("the residual C, row-major M x N", "N", problem.n))
    if problem.has_bias:
        operands.append(("the bias of N", "N", problem.n))
    return operands


def gemm_operand_flaw(problem: "GemmProblem") -> str | None:
    """What both GEMM families ask of a problem's sizes (sm_90: the TMA mainloop's and
    epilogue's check_alignment of A, B, C and D; sm_80: GemmUniversal::can_implement's
    alignment of A, B and C): positive 32-bit extents and 16-byte aligned operands. None,
    or the reason, naming the extent."""
    return dtype_flaw(problem.dtype) or \
        extents_flaw({"M": problem.m, "N": problem.n, "K": problem.k, "batch": problem.batch}) or \
        next(filter(None, (alignment_flaw(operand, name, extent, problem.dtype)
                           for operand, name, extent in gemm_operands(problem))), None)


def sm90_gemm_flaw(kernel: "GemmKernel", problem: "GemmProblem") -> str | None:
    """Why the CUTLASS 3.x kernel of templates/cutlass/gemm_sm90.cu.j2 cannot run `problem`
    (GemmUniversal::can_implement: mainloop, epilogue and tile scheduler), or None. The
    persistent schedules launch a CTA per SM; `ws` launches one per tile, within the grid's
    limits."""
    flaw = gemm_operand_flaw(problem)
    if flaw or kernel.schedule != "ws":
        return flaw
    rows, columns = (problem.n, problem.m) if kernel.swap_ab else (problem.m, problem.n)
    tiles_n = -(-(-(-columns // kernel.tile[1])) // kernel.cluster[1]) * kernel.cluster[1]
    if tiles_n > GRID_YZ_MAX or problem.batch > GRID_YZ_MAX:
        return (f"{tiles_n} column tiles by batch {problem.batch} exceed the grid's {GRID_YZ_MAX} "
                f"(a non-persistent kernel launches a CTA per tile)")
    return None


def sm80_gemm_flaw(kernel: "GemmKernel", problem: "GemmProblem") -> str | None:
    """Why the CUTLASS 2.x kernel of templates/cutlass/gemm_sm80.cu.j2 cannot run `problem`
    (GemmUniversalBase::can_implement: the grid's y (N tiles) and z (batch) within 65535, then
    GemmUniversal::can_implement's alignment), or None."""
    flaw = gemm_operand_flaw(problem)
    if flaw:
        return flaw
    tiles_n = -(-problem.n // kernel.tile[1])
    if tiles_n > GRID_YZ_MAX or problem.batch > GRID_YZ_MAX:
        return f"{tiles_n} column tiles by batch {problem.batch} exceed the grid's {GRID_YZ_MAX}"
    return None


# sm90 schedule -> (CUTLASS kernel schedule, epilogue schedule)
SM90_SCHEDULES = {
    "coop": ("KernelTmaWarpSpecializedCooperative", "TmaWarpSpecializedCooperative"),
    "pingpong": ("KernelTmaWarpSpecializedPingpong", "TmaWarpSpecialized"),
    "ws": ("KernelTmaWarpSpecialized", "TmaWarpSpecialized"),
}


@dataclass(frozen=True)
class GemmKernel:
    sm: int  # 90 or 80
    tile: tuple  # (M, N, K) threadblock tile
    cluster: tuple = (1, 1)  # sm90 only
    # sm90: coop (two consumer warp groups share a tile) | pingpong (two take turns over
    # tiles) | ws (one consumer warp group, not persistent: a CTA per tile, no scheduler loop)
    schedule: str = "coop"
    warp: tuple = (64, 64, 32)  # sm80 only
    stages: int = 3  # sm80 only
    # sm90 cooperative only: K split this many ways (CUTLASS's stream-K tile scheduler in
    # split-K mode; partial sums reduced through the workspace). 1: no split.
    splits: int = 1
    # sm90 cooperative only: the stream-K scheduler in stream-K mode: a last, partial wave
    # of output tiles is shared out over every SM in K-iteration units (N=2304 at M=1024:
    # 144 tiles of 128x128 on 132 SMs would otherwise take two waves).
    stream_k: bool = False
    # sm90 only: the kernel computes D^T = B^T A^T, so the weight is the MMA's A operand
    # (its rows are the problem's N) and the activations are its B operand; `tile` and
    # `cluster` are then in that kernel's terms: (N, M, K) of the problem. What cuBLAS does
    # for M=1024 x N=2304: 192 output columns x 96 rows a CTA fill 132 SMs exactly (12 x 11),
    # where a 96-row tile of the unswapped kernel cannot exist (an MMA has 64-row steps).
    swap_ab: bool = False
    # sm90 only: the (M, N) sub-tile the epilogue stores at a time (M: 128 for cooperative
    # kernels, 64 for pingpong); None: CUTLASS's choice, N of 32. Each sub-tile is a round
    # of register -> shared memory -> TMA store with a barrier between, so a kernel whose
    # CTAs store one tile each and exit is faster with fewer, larger sub-tiles.
    epilogue_tile: tuple | None = None
    # sm90 only: stages of the mainloop's shared-memory pipeline; 0: as many as fit beside
    # the epilogue (CUTLASS's StageCountAutoCarveout). Where each CTA has one tile, fewer can
    # be faster: 4 for the swapped 192x96 one-warp-group kernel at N=2304 (8.0 us against 8.4
    # with the 5 that fit), its first k-tiles arriving sooner when every SM asks at once.
    mainloop_stages: int = 0

    kind = "gemm"

    def output_tile(self) -> tuple:
        """(rows, columns) of D one CTA computes."""
        return (self.tile[1], self.tile[0]) if self.swap_ab else (self.tile[0], self.tile[1])

    def ctas(self, problem: GemmProblem) -> int:
        rows, columns = self.output_tile()
        return -(-problem.m // rows) * -(-problem.n // columns) * problem.batch * self.splits

    def name(self, problem: GemmProblem) -> str:
        element = ELEMENTS[problem.dtype][0]
        tile = "x".join(str(t) for t in self.tile)
        if self.sm == 90:
            shape = f"{tile}_{self.cluster[0]}x{self.cluster[1]}_{self.schedule}"
            if self.splits > 1:
                shape += f"_splitk{self.splits}"
            if self.stream_k:
                shape += "_streamk"
            if self.swap_ab:
                shape += "_swapab"
            if self.epilogue_tile:
                shape += "_epi" + "x".join(str(t) for t in self.epilogue_tile)
            if self.mainloop_stages:
                shape += f"_{self.mainloop_stages}stage"
        else:
            shape = f"{tile}_{'x'.join(str(w) for w in self.warp)}_{self.stages}stage"
        layout = "nt" if problem.b_transposed else "nn"
        return f"cutlass_sm{self.sm}_{element}_{shape}_{layout}_{problem.epilogue_name}"

    def supports(self, problem: GemmProblem) -> str | None:
        """None when this kernel can run the problem, else why not: the configuration's rules,
        then what CUTLASS's can_implement asks of the sizes (sm90_gemm_flaw, sm80_gemm_flaw)."""
        if not isinstance(problem, GemmProblem):
            return f"a GEMM kernel runs GEMM problems, not a {type(problem).__name__}"
        if self.sm == 80 and problem.has_bias and problem.has_residual:
            return "sm80 kernels take either a bias or a residual in the epilogue, not both"
        if problem.has_residual and problem.activation and not problem.residual_in_activation:
            return "an activation before the residual add needs an epilogue visitor tree (not built)"
        if self.swap_ab and (self.sm < 90 or self.splits > 1 or self.stream_k):
            return "operand-swapped kernels are sm90 kernels without split-K or stream-K"
        if self.epilogue_tile and (self.sm < 90 or self.tile[1] % self.epilogue_tile[1]
                                   or self.epilogue_tile[0] != (128 if self.schedule == "coop" else 64)):
            return "an epilogue tile is for sm90 kernels: M of 128 (cooperative) or 64 (pingpong, ws), N dividing the tile's"
        if self.mainloop_stages and self.sm < 90:
            return "mainloop_stages is for sm90 kernels (sm80 kernels take stages)"
        if self.stream_k and (self.sm < 90 or self.schedule != "coop" or self.splits > 1):
            return "stream-K kernels are sm90 cooperative kernels without a fixed split"
        if self.splits > 1:
            if self.sm < 90 or self.schedule != "coop":
                return "split-K kernels are sm90 cooperative kernels"
            if -(-problem.k // self.tile[2]) < 2 * self.splits:
                return f"K={problem.k} is too short to split {self.splits} ways"
        return (sm90_gemm_flaw if self.sm >= 90 else sm80_gemm_flaw)(self, problem)

    def workspace_bytes(self, problem: GemmProblem) -> int:
        """What the kernel needs beyond its operands: split-K keeps a float partial tile per
        output tile (and a barrier word per tile and warp group); stream-K at most that for the
        tiles of its shared waves, or for one wave of units; others need next to nothing."""
        if self.splits == 1 and not self.stream_k:
            return 1 << 20
        tiles = self.ctas(problem) // self.splits
        if self.stream_k:
            tiles = max(tiles, 2 * SM_COUNT[90])
        return tiles * (self.tile[0] * self.tile[1] * 4 + 64) + (1 << 20)

    def type_data(self, problem: GemmProblem) -> dict:
        """What the template needs: the kernel's types for the problem's dtype, layout and
        epilogue (not its sizes, which the kernel takes at run time)."""
        data = {
            "kernel_name": self.name(problem), "element": ELEMENTS[problem.dtype][1],
            "layout_b": "ColumnMajor" if problem.b_transposed else "RowMajor",
            "tile": list(self.tile), "activation": activation_functor(problem.activation),
            "has_bias": problem.has_bias, "has_residual": problem.has_residual,
            "runtime_epilogue": problem.activation == RUNTIME_ACTIVATION,
        }
        if self.sm == 90:
            kernel_schedule, epilogue_schedule = SM90_SCHEDULES[self.schedule]
            data.update(cluster=list(self.cluster), splits=self.splits, stream_k=self.stream_k, swap_ab=self.swap_ab,
                        epilogue_tile=list(self.epilogue_tile) if self.epilogue_tile else None,
                        mainloop_stages=self.mainloop_stages,
                        kernel_schedule=kernel_schedule, epilogue_schedule=epilogue_schedule)
        else:
            data.update(warp=list(self.warp), stages=self.stages)
        return data

    @staticmethod
    def call_sizes(problem: GemmProblem) -> list:
        """ByocCutlassCall.sizes of the problem: m, n, k, batch."""
        return [problem.m, problem.n, problem.k, problem.batch]

    def to_json(self) -> dict:
        data = {"sm": self.sm, "tile": list(self.tile), "cluster": list(self.cluster), "schedule": self.schedule,
                "warp": list(self.warp), "stages": self.stages}
        if self.splits > 1:
            data["splits"] = self.splits
        if self.stream_k:
            data["stream_k"] = True
        if self.swap_ab:
            data["swap_ab"] = True
        if self.epilogue_tile:
            data["epilogue_tile"] = list(self.epilogue_tile)
        if self.mainloop_stages:
            data["mainloop_stages"] = self.mainloop_stages
        return data

    @staticmethod
    def from_json(data: dict) -> "GemmKernel":
        return GemmKernel(sm=data["sm"], tile=tuple(data["tile"]), cluster=tuple(data["cluster"]),
                          schedule=data["schedule"], warp=tuple(data["warp"]), stages=data["stages"],
                          splits=data.get("splits", 1), stream_k=bool(data.get("stream_k", False)),
                          swap_ab=bool(data.get("swap_ab", False)),
                          epilogue_tile=tuple(data["epilogue_tile"]) if data.get("epilogue_tile") else None,
                          mainloop_stages=data.get("mainloop_stages", 0))


# The tuner's candidates. Cooperative kernels need a tile M of at least 128; pingpong runs
# two 64-row consumer warp groups. Clusters of 2 along N share the A tile through TMA
# multicast.
#
# Narrow tiles for few rows (a transformer at batch 1: M=128 gives two 64-row tiles): N of
# 32 or 16 multiplies the CTAs, a K step of 128 halves the mainloop's serial steps. Chosen by
# measurement only (the heuristic's waves x area would pick them everywhere).
NARROW_TILES = (
    GemmKernel(90, (64, 32, 64), (1, 1), "pingpong"),
    GemmKernel(90, (64, 16, 64), (1, 1), "pingpong"),
    GemmKernel(90, (64, 64, 128), (1, 1), "pingpong"),
    GemmKernel(90, (64, 32, 128), (1, 1), "pingpong"),
)
# Tiles for BERT-base's M=1024 GEMMs, for tuning only (each won one of them on an H100,
# bench/results/gemm.md). Operand-swapped kernels (GemmKernel.swap_ab) whose CTAs take 96
# rows (11 x 96 >= 1024) by 192 columns fill the 132 SMs in one wave at N=2304 (12 x 11),
# as cuBLAS's own kernel for that shape does (64 columns: N=768 in 132 CTAs). Epilogue
# sub-tiles as wide as the CTA tile store a CTA's one tile in fewer rounds.
# Measured slower there and left out: unswapped 128x144 and 128x48 tiles (B staged with a
# 32-byte swizzle, N not being a multiple of 64: 14.8 us against 9.8 for N=2304), 2-CTA
# clusters with TMA multicast of the power-of-two and the swapped tiles (0.1-5.4 us
# slower; again on 2026-11-23 for the winners: 192x96 swapped 2x1 8.66 against 8.52 us at
# N=2304, 64x128 2x1 / 1x2 5.29 / 5.05 against 4.94 at N=768), swapped 256x96, 128x96 and
# 128x48 tiles, a K step of 128 at M=1024, and the `ws` schedule on the swapped 192x96 and
# 64x96 tiles with the stages that fit (8.69 against 8.52 us; 4.84 against 4.45).
ONE_WAVE_TILES = (
    GemmKernel(90, (192, 96, 64), (1, 1), "pingpong", swap_ab=True),
    GemmKernel(90, (192, 96, 64), (1, 1), "pingpong", swap_ab=True, epilogue_tile=(64, 96)),
    GemmKernel(90, (64, 96, 64), (1, 1), "pingpong", swap_ab=True),
    GemmKernel(90, (128, 192, 64), (1, 1), "coop", epilogue_tile=(128, 64)),
    GemmKernel(90, (128, 64, 64), (1, 1), "coop", epilogue_tile=(128, 64)),
    GemmKernel(90, (64, 128, 64), (1, 1), "pingpong", epilogue_tile=(64, 64)),
    GemmKernel(90, (64, 128, 64), (1, 1), "pingpong", epilogue_tile=(64, 128)),
    # one consumer warp group, not persistent (a CTA per tile, no scheduler loop): where
    # each CTA has one tile, the lightest kernel. 128x64 by one warp group won N=768 K=768
    # (4.45 us against 4.94 for the 64x128 pingpong and 4.74 for 64x128 by one warp
    # group, H100 with PDL).
    GemmKernel(90, (128, 64, 64), (1, 1), "ws"),
    GemmKernel(90, (64, 128, 64), (1, 1), "ws"),
    # ... with a 4-stage mainloop (H100, PDL, no source C): the swapped 192x96 tile at N=2304
    # (7.5-7.7 us against 8.3-8.4 for the 5-stage pingpong), 128x192 at N=3072 (8.8-8.9
    # against 9.0-9.3 for the cooperative kernel)
    GemmKernel(90, (192, 96, 64), (1, 1), "ws", swap_ab=True, epilogue_tile=(64, 96), mainloop_stages=4),
    GemmKernel(90, (128, 192, 64), (1, 1), "ws", mainloop_stages=4),
)
TUNING_ONLY = NARROW_TILES + ONE_WAVE_TILES
SM90_CANDIDATES = (
    GemmKernel(90, (128, 128, 64), (1, 1), "coop"),
    GemmKernel(90, (128, 256, 64), (1, 1), "coop"),
    GemmKernel(90, (128, 128, 64), (1, 2), "coop"),
    GemmKernel(90, (128, 256, 64), (1, 2), "coop"),
    GemmKernel(90, (256, 128, 64), (1, 1), "coop"),
    GemmKernel(90, (64, 128, 64), (1, 1), "pingpong"),
    GemmKernel(90, (64, 256, 64), (1, 1), "pingpong"),
    GemmKernel(90, (128, 128, 64), (2, 1), "coop"),
    # small tiles: BERT-sized GEMMs (M=1024, N=768) give 128x128 tiles fewer CTAs than SMs
    GemmKernel(90, (64, 64, 64), (1, 1), "pingpong"),
    GemmKernel(90, (128, 64, 64), (1, 1), "coop"),
    # N of 192 and 96: multiples of 768 (BERT's hidden size) that fill 132 SMs in one wave
    # (M=1024: N=2304 or 3072 -> 96 or 128 CTAs of 128x192; N=768 -> 128 CTAs of 64x96),
    # where powers of two leave a second, mostly idle wave
    GemmKernel(90, (128, 192, 64), (1, 1), "coop"),
    GemmKernel(90, (64, 192, 64), (1, 1), "pingpong"),
    GemmKernel(90, (128, 96, 64), (1, 1), "coop"),
    GemmKernel(90, (64, 96, 64), (1, 1), "pingpong"),
) + NARROW_TILES + ONE_WAVE_TILES
SM80_CANDIDATES = (
    GemmKernel(80, (128, 128, 32), warp=(64, 64, 32), stages=3),
    GemmKernel(80, (128, 256, 32), warp=(64, 64, 32), stages=3),
    GemmKernel(80, (256, 128, 32), warp=(64, 64, 32), stages=3),
    GemmKernel(80, (64, 128, 32), warp=(32, 64, 32), stages=4),
    GemmKernel(80, (128, 64, 32), warp=(64, 32, 32), stages=4),
)


# With split_k on: these tiles also run K split 2, 4 and 8 ways (BERT at
# batch 1: M=128, N=768 gives 12 tiles of 128x64 for 132 SMs), and stream-K.
SM90_SPLIT_K = tuple(GemmKernel(90, tile, (1, 1), "coop", splits=splits)
                     for tile in ((128, 128, 64), (128, 64, 64)) for splits in (2, 4, 8))
SM90_STREAM_K = tuple(GemmKernel(90, tile, (1, 1), "coop", stream_k=True)
                      for tile in ((128, 128, 64), (128, 64, 64)))
SM_COUNT = {90: 132, 80: 108}  # H100 SXM and A100: what the heuristic assumes


@dataclass(frozen=True)
class CandidateFilter:
    """What the cutlass Target allows among the candidates (empty: no restriction)."""
    tiles: tuple = ()  # ((M, N, K), ...) threadblock tiles
    clusters: tuple = ()  # ((M, N), ...) cluster shapes (sm90)
    stages: tuple = ()  # stage counts (sm80)
    split_k: bool = False  # tuning also compiles and times the split-K and stream-K kernels
    per_problem: int = 0  # tuning's candidates per problem (kernels.usable_candidates); 0: all

    @staticmethod
    def from_target(attrs: dict) -> "CandidateFilter":
        return CandidateFilter(tiles=tuple(parse_shape(t, 3, "tiles") for t in attrs.get("tiles") or ()),
                               clusters=tuple(parse_shape(c, 2, "clusters") for c in attrs.get("clusters") or ()),
                               stages=tuple(int(x) for x in attrs.get("stages") or ()),
                               split_k=bool(attrs.get("split_k", False)),
                               per_problem=int(attrs.get("tuning_candidates") or 0))

    def admits(self, kernel, measured: bool = False) -> bool:
        """Whether the target allows `kernel`: among the candidates, or (measured) as a
        tuning-database winner, which may split K whatever split_k says (split_k only widens
        what tuning compiles; a split kernel measured fastest is used)."""
        if (getattr(kernel, "splits", 1) > 1 or getattr(kernel, "stream_k", False)) and not self.split_k \
                and not measured:
            return False
        if self.tiles and tuple(kernel.tile) not in self.tiles:
            return False
        if self.clusters and kernel.sm >= 90 and tuple(kernel.cluster) not in self.clusters:
            return False
        if self.stages and kernel.sm < 90 and kernel.stages not in self.stages:
            return False
        return True


def parse_shape(text, rank: int, attr: str) -> tuple:
    """"128x256x64" -> (128, 256, 64); a clear error naming the cutlass attribute otherwise."""
    parts = str(text).lower().split("x")
    if len(parts) != rank or not all(p.isdigit() and int(p) > 0 for p in parts):
        example = "128x128x64" if rank == 3 else "1x2"
        raise ValueError(f"cutlass {attr}: {text!r} is not a shape like {example!r}")
    return tuple(int(p) for p in parts)


NO_FILTER = CandidateFilter()


def candidates(sm: int, allowed: CandidateFilter = NO_FILTER) -> tuple:
    family = SM90_CANDIDATES + SM90_SPLIT_K + SM90_STREAM_K if sm >= 90 else SM80_CANDIDATES
    return tuple(kernel for kernel in family if allowed.admits(kernel))


def estimated_cycles(kernel: GemmKernel, problem: GemmProblem) -> float:
    """A cheap model of `kernel`'s time on `problem`, to rank the candidates before any is
    compiled (tuning times only the first few: CandidateFilter.per_problem). The CTAs run in
    waves of one per SM; a CTA's K loop is bound by its tensor cores (its tile's
    multiply-adds, about 1024 a cycle on an SM) or by its operands' traffic (its tile's rows
    plus columns, about 32 elements a cycle), whichever is slower, plus a fixed cost a K step
    (half for pingpong, whose two consumer warp groups hide each other's) and an epilogue
    cost for its output tile. On the H100 measurements in tuning_sm90.json (every GEMM problem
    whose candidates were all timed) the winner is among the model's first four every time
    (tests/test_cutlass.py)."""
    rows, columns = kernel.output_tile()
    waves = -(-kernel.ctas(problem) // SM_COUNT[90 if kernel.sm >= 90 else 80])
    k_steps = -(-(-(-problem.k // kernel.splits)) // kernel.tile[2])
    per_element_of_k = max(rows * columns / 1024, (rows + columns) / 32)
    step_cost = 200 / (2 if kernel.schedule == "pingpong" else 1)
    return waves * (k_steps * (kernel.tile[2] * per_element_of_k + step_cost) + 10 * rows * columns / 64)


def heuristic_kernel(sm: int, problem: GemmProblem, allowed: CandidateFilter = NO_FILTER) -> GemmKernel:
    """The documented choice without a GPU or a tuning-database entry, by wave
    quantization: a GEMM takes about ceil(CTAs / SMs) waves of one tile's work each
    (132 SMs on an H100, 108 on an A100), so the estimate is waves x tile area, and the
    smallest estimate wins; among equals, the larger tile (more reuse per CTA), then the
    earlier candidate. Split-K, stream-K and the tuning-only tiles (narrow, one-wave) only
    where nothing else is allowed (split-K and stream-K were measured slower; see the
    module docstring)."""
    sm_count = SM_COUNT[90 if sm >= 90 else 80]
    supported = [k for k in candidates(sm, allowed) if k.supports(problem) is None]
    usable = [k for k in supported if k.splits == 1 and not k.stream_k and k not in TUNING_ONLY] or supported
    if not usable:
        allowed_kernels = candidates(sm, allowed)
        why = f": {allowed_kernels[0].supports(problem)}" if allowed_kernels else ""
        raise ValueError(f"no sm{sm} kernel supports {problem.key} (among the candidates the cutlass target "
                         f"allows){why}")

    def estimate(indexed):
        position, kernel = indexed
        area = kernel.tile[0] * kernel.tile[1]
        return (-(-kernel.ctas(problem) // sm_count) * area, -area, position)

    return min(enumerate(usable), key=estimate)[1]
