"""CUTLASS GEMM kernels as data: a configuration (arch, dtype, tile, cluster or warp
shape, stages, schedule) whose name spells it, the problem it runs (M, N, K, batch,
layout of B, epilogue), and the candidates the tuner chooses among.

    cutlass_sm90_f16_128x256x64_1x2_coop_bias_gelu
    cutlass_sm80_bf16_128x128x32_64x64x32_3stage_residual

Templates (templates/cutlass/gemm_sm90.cu.j2, gemm_sm80.cu.j2) receive `template_data()`:
plain values only.
"""
from __future__ import annotations

from dataclasses import dataclass

ELEMENTS = {"float16": ("f16", "cutlass::half_t"), "bfloat16": ("bf16", "cutlass::bfloat16_t")}
# epilogue activation name in byoc -> CUTLASS activation functor
ACTIVATIONS = {None: "Identity", "relu": "ReLu", "gelu": "GELU", "gelu_tanh": "GELU_taylor",
               "silu": "SiLu", "sigmoid": "Sigmoid"}


@dataclass(frozen=True)
class GemmProblem:
    """What one partition computes: D = act(A @ B + bias) + residual, batched over L."""
    m: int
    n: int
    k: int
    batch: int
    dtype: str  # float16 | bfloat16
    b_transposed: bool  # B is stored N x K (K contiguous)
    activation: str | None = None
    has_bias: bool = False
    has_residual: bool = False

    @property
    def epilogue_name(self) -> str:
        parts = (["bias"] if self.has_bias else []) + ([self.activation] if self.activation else []) + \
            (["residual"] if self.has_residual else [])
        return "_".join(parts) or "plain"

    @property
    def key(self) -> str:
        """The tuning-database key: everything the choice of kernel depends on."""
        return (f"{self.dtype}:m{self.m}:n{self.n}:k{self.k}:l{self.batch}:"
                f"{'nt' if self.b_transposed else 'nn'}:{self.epilogue_name}")


@dataclass(frozen=True)
class GemmKernel:
    sm: int  # 90 or 80
    tile: tuple  # (M, N, K) threadblock tile
    cluster: tuple = (1, 1)  # sm90 only
    schedule: str = "coop"  # sm90: coop | pingpong
    warp: tuple = (64, 64, 32)  # sm80 only
    stages: int = 3  # sm80 only

    def name(self, problem: GemmProblem) -> str:
        element = ELEMENTS[problem.dtype][0]
        tile = "x".join(str(t) for t in self.tile)
        if self.sm == 90:
            shape = f"{tile}_{self.cluster[0]}x{self.cluster[1]}_{self.schedule}"
        else:
            shape = f"{tile}_{'x'.join(str(w) for w in self.warp)}_{self.stages}stage"
        layout = "nt" if problem.b_transposed else "nn"
        return f"cutlass_sm{self.sm}_{element}_{shape}_{layout}_{problem.epilogue_name}"

    def supports(self, problem: GemmProblem) -> str | None:
        """None when this kernel can run the problem, else why not."""
        if self.sm == 80 and problem.has_bias and problem.has_residual:
            return "sm80 kernels take either a bias or a residual in the epilogue, not both"
        if problem.has_residual and problem.activation:
            return "an activation before the residual add needs an epilogue visitor tree (not built)"
        return None

    def template_data(self, problem: GemmProblem, symbol: str, arg_indices: dict) -> dict:
        data = {
            "kernel_name": self.name(problem), "symbol": symbol,
            "element": ELEMENTS[problem.dtype][1],
            "layout_b": "ColumnMajor" if problem.b_transposed else "RowMajor",
            "tile": list(self.tile), "activation": ACTIVATIONS[problem.activation],
            "has_bias": problem.has_bias, "has_residual": problem.has_residual,
            "m": problem.m, "n": problem.n, "k": problem.k, "batch": problem.batch,
            "a_index": arg_indices["a"], "b_index": arg_indices["b"],
            "bias_index": arg_indices.get("bias", -1), "residual_index": arg_indices.get("residual", -1),
        }
        if self.sm == 90:
            cooperative = self.schedule == "coop"
            data.update(cluster=list(self.cluster),
                        kernel_schedule="KernelTmaWarpSpecializedCooperative" if cooperative
                        else "KernelTmaWarpSpecializedPingpong",
                        epilogue_schedule="TmaWarpSpecializedCooperative" if cooperative
                        else "TmaWarpSpecialized")
        else:
            data.update(warp=list(self.warp), stages=self.stages)
        return data

    def to_json(self) -> dict:
        return {"sm": self.sm, "tile": list(self.tile), "cluster": list(self.cluster), "schedule": self.schedule,
                "warp": list(self.warp), "stages": self.stages}

    @staticmethod
    def from_json(data: dict) -> "GemmKernel":
        return GemmKernel(sm=data["sm"], tile=tuple(data["tile"]), cluster=tuple(data["cluster"]),
                          schedule=data["schedule"], warp=tuple(data["warp"]), stages=data["stages"])


# The tuner's candidates. Cooperative kernels need a tile M of at least 128; pingpong runs
# two 64-row consumer warp groups. Clusters of 2 along N share the A tile through TMA
# multicast.
SM90_CANDIDATES = (
    GemmKernel(90, (128, 128, 64), (1, 1), "coop"),
    GemmKernel(90, (128, 256, 64), (1, 1), "coop"),
    GemmKernel(90, (128, 128, 64), (1, 2), "coop"),
    GemmKernel(90, (128, 256, 64), (1, 2), "coop"),
    GemmKernel(90, (256, 128, 64), (1, 1), "coop"),
    GemmKernel(90, (64, 128, 64), (1, 1), "pingpong"),
    GemmKernel(90, (64, 256, 64), (1, 1), "pingpong"),
    GemmKernel(90, (128, 128, 64), (2, 1), "coop"),
)
SM80_CANDIDATES = (
    GemmKernel(80, (128, 128, 32), warp=(64, 64, 32), stages=3),
    GemmKernel(80, (128, 256, 32), warp=(64, 64, 32), stages=3),
    GemmKernel(80, (256, 128, 32), warp=(64, 64, 32), stages=3),
    GemmKernel(80, (64, 128, 32), warp=(32, 64, 32), stages=4),
    GemmKernel(80, (128, 64, 32), warp=(64, 32, 32), stages=4),
)


def candidates(sm: int) -> tuple:
    return SM90_CANDIDATES if sm >= 90 else SM80_CANDIDATES


def heuristic_kernel(sm: int, problem: GemmProblem) -> GemmKernel:
    """The documented choice without a GPU or a tuning-database entry: big tiles for
    problems that fill the 132 SMs of an H100 (or 108 of an A100) at least once, smaller
    tiles otherwise so that more CTAs run."""
    sm_count = 132 if sm >= 90 else 108
    ordered = candidates(sm)
    usable = [k for k in ordered if k.supports(problem) is None]
    if not usable:
        raise ValueError(f"no sm{sm} kernel supports {problem.key}")

    def ctas(kernel):
        return -(-problem.m // kernel.tile[0]) * -(-problem.n // kernel.tile[1]) * problem.batch

    for kernel in usable:  # ordered from the usual best for large problems
        if ctas(kernel) >= sm_count:
            return kernel
    return max(usable, key=ctas)
