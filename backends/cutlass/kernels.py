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

Templates (templates/cutlass/gemm_sm90.cu.j2, gemm_sm80.cu.j2) receive `template_data()`:
plain values only.
"""
from __future__ import annotations

from dataclasses import dataclass

ELEMENTS = {"float16": ("f16", "cutlass::half_t"), "bfloat16": ("bf16", "cutlass::bfloat16_t")}
# epilogue activation name in byoc -> CUTLASS activation functor
ACTIVATIONS = {None: "Identity", "relu": "ReLu", "gelu": "GELU", "gelu_tanh": "GELU_taylor",
               "silu": "SiLu", "sigmoid": "Sigmoid", "hard_swish": "HardSwish"}


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
        """None when this kernel can run the problem, else why not."""
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
        return None

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

    def template_data(self, problem: GemmProblem, symbol: str, arg_indices: dict) -> dict:
        data = {
            "kernel_name": self.name(problem), "symbol": symbol,
            "element": ELEMENTS[problem.dtype][1],
            "layout_b": "ColumnMajor" if problem.b_transposed else "RowMajor",
            "tile": list(self.tile), "activation": ACTIVATIONS[problem.activation],
            "has_bias": problem.has_bias, "has_residual": problem.has_residual,
            "alpha": f"{float(problem.alpha)!r}f",  # repr: always a valid C++ float literal (1.0f, 1e-05f)
            "m": problem.m, "n": problem.n, "k": problem.k, "batch": problem.batch,
            "a_index": arg_indices["a"], "b_index": arg_indices["b"],
            "bias_index": arg_indices.get("bias", -1), "residual_index": arg_indices.get("residual", -1),
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

    @staticmethod
    def from_target(attrs: dict) -> "CandidateFilter":
        return CandidateFilter(tiles=tuple(parse_shape(t, 3, "tiles") for t in attrs.get("tiles") or ()),
                               clusters=tuple(parse_shape(c, 2, "clusters") for c in attrs.get("clusters") or ()),
                               stages=tuple(int(x) for x in attrs.get("stages") or ()),
                               split_k=bool(attrs.get("split_k", False)))

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
        raise ValueError(f"no sm{sm} kernel supports {problem.key} (among the candidates the cutlass target allows)")

    def estimate(indexed):
        position, kernel = indexed
        area = kernel.tile[0] * kernel.tile[1]
        return (-(-kernel.ctas(problem) // sm_count) * area, -area, position)

    return min(enumerate(usable), key=estimate)[1]


# ---------------------------------------------------------------- 2-D convolutions (NHWC)


@dataclass(frozen=True)
class ConvProblem:
    """What one conv partition computes, NHWC data and OHWI (KRSC) filters:
    y = act(conv2d(x, w) + bias + residual); as an implicit GEMM, M = N*P*Q output
    pixels, N = K output channels, K = C*R*S."""
    batch: int
    height: int
    width: int
    in_channels: int
    out_channels: int
    kernel_h: int
    kernel_w: int
    out_h: int
    out_w: int
    strides: tuple
    pads: tuple  # top, left, bottom, right
    dilations: tuple
    dtype: str
    activation: str | None = None
    has_bias: bool = False
    has_residual: bool = False

    @property
    def epilogue_name(self) -> str:
        parts = (["bias"] if self.has_bias else []) + (["residual"] if self.has_residual else []) + \
            ([self.activation] if self.activation else [])
        return "_".join(parts) or "plain"

    @property
    def gemm_shape(self) -> tuple:
        return (self.batch * self.out_h * self.out_w, self.out_channels,
                self.in_channels * self.kernel_h * self.kernel_w)

    @property
    def key(self) -> str:
        """The tuning-database key: everything the choice of kernel depends on."""
        return (f"conv2d:{self.dtype}:n{self.batch}h{self.height}w{self.width}c{self.in_channels}:"
                f"k{self.out_channels}r{self.kernel_h}s{self.kernel_w}:"
                f"stride{'x'.join(map(str, self.strides))}:pad{'x'.join(map(str, self.pads))}:"
                f"dilation{'x'.join(map(str, self.dilations))}:{self.epilogue_name}")

    def as_gemm(self) -> GemmProblem | None:
        """A pointwise conv (1x1, stride 1, no padding) as the GEMM it is: x as [N*H*W, C]
        times the K x 1 x 1 x C filter as B stored N x K, the same epilogue (its operands keep
        their places: a, b, bias, residual); None for any other conv."""
        if (self.kernel_h, self.kernel_w) != (1, 1) or tuple(self.strides) != (1, 1) or any(self.pads):
            return None
        return GemmProblem(m=self.batch * self.height * self.width, n=self.out_channels, k=self.in_channels,
                           batch=1, dtype=self.dtype, b_transposed=True, activation=self.activation,
                           has_bias=self.has_bias, has_residual=self.has_residual, residual_in_activation=True)

    def operand_sizes(self) -> list:
        """Elements of x, w, bias, residual (0 when absent) and of the output, for the profiler."""
        output = self.batch * self.out_h * self.out_w * self.out_channels
        return [self.batch * self.height * self.width * self.in_channels,
                self.out_channels * self.kernel_h * self.kernel_w * self.in_channels,
                self.out_channels if self.has_bias else 0, output if self.has_residual else 0, output]


@dataclass(frozen=True)
class ConvKernel:
    """An implicit-GEMM conv2d fprop configuration. sm_90: CUTLASS 3.x TMA im2col + wgmma
    (one consumer warp group: CUTLASS has no persistent schedules for conv); sm_80: CUTLASS
    2.x multistage with the optimized activation iterator, or (fixed_channels) the iterator
    for images of FIXED_CHANNELS channels, a stem's RGB padded by PadConvChannels.

    Why a second iterator: the others walk the GEMM's K as (filter tap, channel block), a
    tile's K of 64 channels at a time, so 4 channels would leave 15/16 of every MMA zeros.
    The fixed-channel iterator walks (tap, channel) jointly, one 8-byte pixel per tap, and
    runs on sm_90 too (a CUTLASS 2.x kernel)."""
    sm: int
    tile: tuple  # (M, N, K) threadblock tile of the implicit GEMM
    cluster: tuple = (1, 1)  # sm90 only
    warp: tuple = (64, 64, 32)  # sm80 only
    stages: int = 3  # sm80 only
    fixed_channels: bool = False  # sm80 only: the fixed-channel activation/filter iterators

    kind = "conv2d"

    def name(self, problem: ConvProblem) -> str:
        element = ELEMENTS[problem.dtype][0]
        tile = "x".join(str(t) for t in self.tile)
        if self.sm == 90:
            shape = f"{tile}_{self.cluster[0]}x{self.cluster[1]}_ws"
        else:
            shape = f"{tile}_{'x'.join(str(w) for w in self.warp)}_{self.stages}stage"
            if self.fixed_channels:
                shape += f"_fixed{problem.in_channels}"
        return f"cutlass_sm{self.sm}_{element}_fprop_{shape}_{problem.epilogue_name}"

    def supports(self, problem: ConvProblem) -> str | None:
        # every epilogue the conv patterns admit runs on every conv kernel; the channel
        # count picks the iterator
        if self.fixed_channels and problem.in_channels != FIXED_CHANNELS:
            return f"the fixed-channel iterator takes C={FIXED_CHANNELS}, not {problem.in_channels}"
        if not self.fixed_channels and problem.in_channels % 8:
            return f"C={problem.in_channels} is not a multiple of 8 (16-byte pixel loads)"
        return None

    def template(self) -> str:
        return "cutlass/conv2d_sm90.cu.j2" if self.sm >= 90 else "cutlass/conv2d_sm80.cu.j2"

    def template_data(self, problem: ConvProblem, symbol: str, arg_indices: dict) -> dict:
        data = {
            "kernel_name": self.name(problem), "symbol": symbol, "element": ELEMENTS[problem.dtype][1],
            "tile": list(self.tile), "activation": ACTIVATIONS[problem.activation],
            "has_bias": problem.has_bias, "has_residual": problem.has_residual,
            "batch": problem.batch, "height": problem.height, "width": problem.width,
            "in_channels": problem.in_channels, "out_channels": problem.out_channels,
            "kernel_h": problem.kernel_h, "kernel_w": problem.kernel_w,
            "out_h": problem.out_h, "out_w": problem.out_w,
            "strides": list(problem.strides), "pads": list(problem.pads), "dilations": list(problem.dilations),
            "a_index": arg_indices["a"], "b_index": arg_indices["b"],
            "bias_index": arg_indices.get("bias", -1), "residual_index": arg_indices.get("residual", -1),
        }
        if self.sm == 90:
            data.update(cluster=list(self.cluster))
        else:
            data.update(warp=list(self.warp), stages=self.stages,
                        iterator="kFixedChannels" if self.fixed_channels else "kOptimized",
                        # the fixed-channel iterators load one pixel (all its channels) at a time
                        input_alignment=problem.in_channels if self.fixed_channels else None)
        return data

    def to_json(self) -> dict:
        data = {"kind": self.kind, "sm": self.sm, "tile": list(self.tile), "cluster": list(self.cluster),
                "warp": list(self.warp), "stages": self.stages}
        if self.fixed_channels:
            data["fixed_channels"] = True
        return data

    @staticmethod
    def from_json(data: dict) -> "ConvKernel":
        return ConvKernel(sm=data["sm"], tile=tuple(data["tile"]), cluster=tuple(data["cluster"]),
                          warp=tuple(data["warp"]), stages=data["stages"],
                          fixed_channels=bool(data.get("fixed_channels", False)))


# Conv candidates. sm90: tile M of 64 or 128 (one consumer warp group holds the whole
# accumulator, so 128x256 would spill); clusters of 2 multicast the filter tile (along M)
# or the im2col activation tile (along N) through TMA. sm80: CUTLASS's usual fprop tiles.
SM90_CONV_CANDIDATES = (
    ConvKernel(90, (128, 128, 64), (1, 1)),
    ConvKernel(90, (128, 128, 64), (2, 1)),
    ConvKernel(90, (128, 128, 64), (1, 2)),
    ConvKernel(90, (128, 64, 64), (1, 1)),
    ConvKernel(90, (64, 128, 64), (1, 1)),
    ConvKernel(90, (64, 64, 64), (2, 1)),
)
SM80_CONV_CANDIDATES = (
    ConvKernel(80, (128, 128, 32), warp=(64, 64, 32), stages=3),
    ConvKernel(80, (128, 128, 64), warp=(64, 64, 64), stages=3),
    ConvKernel(80, (256, 64, 32), warp=(64, 64, 32), stages=4),
    ConvKernel(80, (128, 64, 32), warp=(64, 32, 32), stages=4),
    ConvKernel(80, (64, 64, 32), warp=(32, 32, 32), stages=5),
)
# Convs of FIXED_CHANNELS input channels (PadConvChannels pads RGB stems to it: 8-byte
# pixels), on either arch. Stems have few output channels (64): tile N of 64.
FIXED_CHANNELS = 4
FIXED_CHANNEL_CONV_CANDIDATES = (
    ConvKernel(80, (128, 64, 64), warp=(64, 32, 64), stages=3, fixed_channels=True),
    ConvKernel(80, (128, 64, 32), warp=(64, 32, 32), stages=4, fixed_channels=True),
    ConvKernel(80, (256, 64, 32), warp=(64, 64, 32), stages=3, fixed_channels=True),
    ConvKernel(80, (64, 64, 64), warp=(32, 32, 64), stages=4, fixed_channels=True),
    ConvKernel(80, (64, 64, 32), warp=(32, 32, 32), stages=6, fixed_channels=True),
    ConvKernel(80, (256, 64, 64), warp=(64, 64, 64), stages=3, fixed_channels=True),
)


def conv_candidates(sm: int, allowed: CandidateFilter = NO_FILTER) -> tuple:
    family = (SM90_CONV_CANDIDATES if sm >= 90 else SM80_CONV_CANDIDATES) + FIXED_CHANNEL_CONV_CANDIDATES
    return tuple(kernel for kernel in family if allowed.admits(kernel))


def heuristic_conv_kernel(sm: int, problem: ConvProblem, allowed: CandidateFilter = NO_FILTER) -> ConvKernel:
    """The documented choice for a conv without a GPU or a tuning-database entry (the same
    rule as GEMMs, on the implicit GEMM's M = N*P*Q and N = K): the first candidate whose
    CTAs fill the GPU once; otherwise the one with the most CTAs. Output channels of at
    most 64 take a tile N of 64, so that half of every CTA's work is not padding."""
    sm_count = 132 if sm >= 90 else 108
    m, n, _ = problem.gemm_shape
    allowed_kernels = conv_candidates(sm, allowed)
    if not allowed_kernels:
        raise ValueError(f"no sm{sm} conv kernel the cutlass target allows ({problem.key})")
    allowed_kernels = [k for k in allowed_kernels if k.supports(problem) is None] or \
        [k for k in conv_candidates(sm) if k.supports(problem) is None]
    usable = [k for k in allowed_kernels if n > 64 or k.tile[1] == 64] or list(allowed_kernels)

    def ctas(kernel):
        return -(-m // kernel.tile[0]) * -(-n // kernel.tile[1])

    for kernel in usable:
        if ctas(kernel) >= sm_count:
            return kernel
    # a small problem: the most CTAs, and among equals the smallest tile (least padding)
    return max(usable, key=lambda kernel: (ctas(kernel), -kernel.tile[0] * kernel.tile[1]))


# ---------------------------------------------------------------- one interface for both families


def usable_candidates(sm: int, problem, allowed: CandidateFilter = NO_FILTER) -> list:
    """The candidates of the problem's family (GEMM or conv) that the target allows and
    that can run it, the heuristic's choice first (the tuner's reference)."""
    family = conv_candidates(sm, allowed) if isinstance(problem, ConvProblem) else candidates(sm, allowed)
    usable = [kernel for kernel in family if kernel.supports(problem) is None]
    if usable:
        first = default_kernel(sm, problem, allowed)
        usable = [first] + [kernel for kernel in usable if kernel != first]
    return usable


def default_kernel(sm: int, problem, allowed: CandidateFilter = NO_FILTER):
    """The heuristic choice for a GEMM or a conv problem."""
    if isinstance(problem, ConvProblem):
        return heuristic_conv_kernel(sm, problem, allowed)
    return heuristic_kernel(sm, problem, allowed)


def kernel_workspace_bytes(kernel, problem) -> int:
    """Workspace the partition's kernel needs (conv kernels: as non-split GEMMs)."""
    return kernel.workspace_bytes(problem) if isinstance(kernel, GemmKernel) else 1 << 20


def kernel_from_json(data: dict):
    """A kernel recorded in the tuning database (entries without "kind" are GEMMs); a
    ValueError that says what is wrong for an entry that is not a kernel byoc can render (a
    database is shared between machines and may be edited by hand)."""
    if not isinstance(data, dict):
        raise ValueError(f"a kernel is a JSON object, not {data!r}")
    try:
        kernel = ConvKernel.from_json(data) if data.get("kind") == "conv2d" else GemmKernel.from_json(data)
    except KeyError as missing:
        raise ValueError(f"kernel {data} has no {missing}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"kernel {data} is malformed: {error}") from None
    flaw = _kernel_flaw(kernel)
    if flaw:
        raise ValueError(f"kernel {data}: {flaw}")
    return kernel


def _kernel_flaw(kernel) -> str | None:
    """Why `kernel` is not one this backend renders (None when it is)."""
    def shape(value, rank):
        return (isinstance(value, tuple) and len(value) == rank
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value))
    if kernel.sm not in (80, 90):
        return f"sm is {kernel.sm!r}, expected 80 or 90"
    if not shape(kernel.tile, 3):
        return f"tile is {list(kernel.tile)!r}, expected three positive integers (M, N, K)"
    if kernel.sm == 90 and not shape(kernel.cluster, 2):
        return f"cluster is {list(kernel.cluster)!r}, expected two positive integers"
    if kernel.sm == 80 and not (shape(kernel.warp, 3) and isinstance(kernel.stages, int) and kernel.stages >= 2):
        return "sm80 kernels need a warp tile of three positive integers and at least 2 stages"
    if isinstance(kernel, ConvKernel) and kernel.fixed_channels and kernel.sm != 80:
        return "the fixed-channel iterator is a CUTLASS 2.x (sm 80) kernel"
    if isinstance(kernel, GemmKernel):
        if kernel.sm == 90 and kernel.schedule not in SM90_SCHEDULES:
            return f"schedule is {kernel.schedule!r}, expected one of {sorted(SM90_SCHEDULES)}"
        if not (isinstance(kernel.splits, int) and kernel.splits >= 1):
            return f"splits is {kernel.splits!r}, expected a positive integer"
        if kernel.epilogue_tile is not None and not shape(kernel.epilogue_tile, 2):
            return f"epilogue_tile is {list(kernel.epilogue_tile)!r}, expected two positive integers"
        stages = kernel.mainloop_stages
        if not (isinstance(stages, int) and not isinstance(stages, bool) and (stages == 0 or 2 <= stages <= 16)):
            return f"mainloop_stages is {stages!r}, expected 0 (as many as fit) or 2 to 16"
    return None


# CUTLASS's programmatic-dependent-launch support (the cutlass target's pdl) in its sm90
# kernels. Its stream-K tile scheduler (split-K and stream-K kernels) does not compile with it
# (CUTLASS 4.2: sm90_tile_scheduler_stream_k.hpp's const is_last_tile calls a non-const
# member), so those kernels are built and launched without it.
PDL_FLAG = "-DCUTLASS_ENABLE_GDC_FOR_SM90"


def kernel_flags(kernel, flags: list) -> list:
    """The nvcc flags of `kernel`'s compile unit: the target's, less PDL where it cannot build."""
    if getattr(kernel, "splits", 1) > 1 or getattr(kernel, "stream_k", False):
        return [flag for flag in flags if flag != PDL_FLAG]
    return list(flags)


# Template data that only a kernel's entry point reads: its symbol and name, the problem's
# sizes, the argument slots and alpha. Renders that differ in nothing else name the same
# CUTLASS kernel types (the kernels take their sizes at run time), so one compile unit holds
# them all and instantiates the types once: the bulk of a unit's compile time (about 20 of
# 30 s for an sm90 GEMM), against well under a second per extra entry point.
ENTRY_POINT_FIELDS = frozenset({
    "kernel_name", "symbol", "m", "n", "k", "batch", "alpha",
    "a_index", "b_index", "bias_index", "residual_index",
    "height", "width", "in_channels", "out_channels", "kernel_h", "kernel_w", "out_h", "out_w",
    "strides", "pads", "dilations"})


def kernel_type_key(template: str, data: dict, flags: list) -> tuple:
    """What decides the CUTLASS types a render instantiates: the template, the unit's
    compile flags and the template data less the entry point's (ENTRY_POINT_FIELDS).
    Renders with one key go into one compile unit (compile_unit_sources); two renders whose
    types differ after all would still compile together, only not faster."""
    import json
    type_data = {key: value for key, value in data.items() if key not in ENTRY_POINT_FIELDS}
    return template, tuple(flags), json.dumps(type_data, sort_keys=True)


def compile_unit_sources(renders: list) -> dict:
    """[(kernel type key, symbol, rendered source)] -> {first symbol: one compile unit's
    source}: the renders of one key concatenated (each is self-contained: its types in the
    symbol's own namespace, its headers guarded), in the order given."""
    groups: dict = {}
    for key, symbol, text in renders:
        groups.setdefault(key, []).append((symbol, text))
    sources = {}
    for members in groups.values():
        symbols = [symbol for symbol, _ in members]
        head = "" if len(symbols) == 1 else (
            f"// One compile unit for the {len(symbols)} entry points of one kernel type (its CUTLASS "
            f"types are instantiated once): {', '.join(symbols)}\n\n")
        sources[symbols[0]] = head + "\n".join(text for _, text in members)
    return sources


def kernel_template(kernel) -> str:
    """The template that renders `kernel`."""
    if isinstance(kernel, ConvKernel):
        return kernel.template()
    return "cutlass/gemm_sm90.cu.j2" if kernel.sm >= 90 else "cutlass/gemm_sm80.cu.j2"


def operand_sizes(problem) -> list:
    """Elements of a/x, b/w, bias, residual (0 when absent) and of the output."""
    if isinstance(problem, ConvProblem):
        return problem.operand_sizes()
    m, n, k, batch = problem.m, problem.n, problem.k, problem.batch
    return [m * k * batch, n * k * batch, n if problem.has_bias else 0,
            m * n * batch if problem.has_residual else 0, m * n * batch]
