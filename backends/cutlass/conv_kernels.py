"""CUTLASS 2-D convolution kernels (NHWC data, KRSC filters) as data: the problem (sizes,
strides, pads, dilations, epilogue), a kernel configuration whose name spells it, the
candidates the tuner chooses among and the heuristic's choice. On sm_90 a pointwise conv
(1x1, stride 1, unpadded) runs as the GEMM it is (ConvProblem.as_gemm).

Templates (templates/cutlass/conv2d_sm90.cu.j2, conv2d_sm80.cu.j2) receive `type_data()`,
plain values that depend on the kernel's types only; a partition's extents, strides, pads
and dilations (`call_sizes()`) reach the kernel at run time.
"""
from __future__ import annotations

from dataclasses import dataclass

from .gemm_kernels import (ELEMENT_BITS, RUNTIME_ACTIVATION, activation_functor, ELEMENTS, GRID_YZ_MAX, NO_FILTER, CandidateFilter, GemmProblem,
                           alignment_flaw, dtype_flaw, extents_flaw, gemm_operand_flaw)


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
        their places: a, b, bias, residual); None for any other conv, and where the GEMM
        kernels could not run that GEMM (C of 4, which the fixed-channel conv kernels take:
        the GEMM's A and B are then rows of 8 bytes), so that the conv stays a conv."""
        if (self.kernel_h, self.kernel_w) != (1, 1) or tuple(self.strides) != (1, 1) or any(self.pads):
            return None
        gemm = GemmProblem(m=self.batch * self.height * self.width, n=self.out_channels, k=self.in_channels,
                           batch=1, dtype=self.dtype, b_transposed=True, activation=self.activation,
                           has_bias=self.has_bias, has_residual=self.has_residual, residual_in_activation=True)
        return gemm if gemm_operand_flaw(gemm) is None else None

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
        """None when this kernel can run the problem, else why not. Every epilogue the conv
        patterns admit runs on every conv kernel; what CUTLASS's can_implement asks of the
        sizes decides (sm90_conv_flaw, sm80_conv_flaw), the channel count picking the iterator."""
        if not isinstance(problem, ConvProblem):
            return f"a conv kernel runs conv problems, not a {type(problem).__name__}"
        if self.fixed_channels and self.sm != 80:
            return "the fixed-channel iterator is a CUTLASS 2.x (sm 80) kernel"
        return (sm90_conv_flaw if self.sm >= 90 else sm80_conv_flaw)(self, problem)

    def template(self) -> str:
        return "cutlass/conv2d_sm90.cu.j2" if self.sm >= 90 else "cutlass/conv2d_sm80.cu.j2"

    def type_data(self, problem: ConvProblem) -> dict:
        """What the template needs: the kernel's types for the problem's dtype and epilogue
        (not its sizes, which the kernel takes at run time)."""
        data = {
            "kernel_name": self.name(problem), "element": ELEMENTS[problem.dtype][1],
            "tile": list(self.tile), "activation": activation_functor(problem.activation),
            "has_bias": problem.has_bias, "has_residual": problem.has_residual,
            "runtime_epilogue": problem.activation == RUNTIME_ACTIVATION,
        }
        if self.sm == 90:
            data.update(cluster=list(self.cluster))
        else:
            data.update(warp=list(self.warp), stages=self.stages,
                        iterator="kFixedChannels" if self.fixed_channels else "kOptimized",
                        # the fixed-channel iterators load one pixel (all its channels) at a time
                        input_alignment=problem.in_channels if self.fixed_channels else None)
        return data

    @staticmethod
    def call_sizes(problem: ConvProblem) -> list:
        """ByocCutlassCall.sizes of the problem: n h w c k r s p q, strides (h, w), pads
        (top, left, bottom, right), dilations (h, w)."""
        return [problem.batch, problem.height, problem.width, problem.in_channels, problem.out_channels,
                problem.kernel_h, problem.kernel_w, problem.out_h, problem.out_w,
                *problem.strides, *problem.pads, *problem.dilations]

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


# Limits of the conv kernels beyond alignment. sm_90's TMA im2col (the conv mainloop's
# can_implement, 2-D convs): pads in [0, 256], lower and upper corners signed 8-bit, the
# dilated filter's reach (its offsets) unsigned 8-bit. sm_80's optimized activation iterator
# keeps one mask bit per filter row and column (R, S <= 32), and ImplicitGemmConvolution's
# can_implement wants each of x, w and y below 2^31 bytes (32-bit offsets).
IM2COL_PAD_LIMIT = 256
IM2COL_CORNER_LIMIT = 128
IM2COL_OFFSET_LIMIT = 255
MAX_FILTER_SIZE = 32
INT32_BYTES = 1 << 31


def conv_extents_flaw(problem: ConvProblem) -> str | None:
    """Both conv families: a float16/bfloat16 problem of positive 32-bit extents, strides and
    dilations (the templates read them as int) and pads of at least 0."""
    flaw = dtype_flaw(problem.dtype) or extents_flaw({
        "N": problem.batch, "H": problem.height, "W": problem.width, "C": problem.in_channels,
        "K": problem.out_channels, "R": problem.kernel_h, "S": problem.kernel_w, "P": problem.out_h,
        "Q": problem.out_w, "stride_h": problem.strides[0], "stride_w": problem.strides[1],
        "dilation_h": problem.dilations[0], "dilation_w": problem.dilations[1]})
    if flaw is None and min(problem.pads) < 0:
        flaw = f"pads {tuple(problem.pads)} are negative"
    return flaw


def _pixel_alignment_flaw(problem: ConvProblem) -> str | None:
    """x (NHWC) and w (KRSC) read along C in 16-byte vectors (sm_90's TMA check_alignment,
    sm_80's optimized activation and filter iterators)."""
    return alignment_flaw("the NHWC input x and the KRSC filter w", "C", problem.in_channels, problem.dtype)


def _output_alignment_flaw(problem: ConvProblem) -> str | None:
    """y, the residual (N x P x Q x K) and the bias (K) along K in 16-byte vectors (sm_90's
    epilogue check_alignment, sm_80's kAlignmentC)."""
    operands = ["the NPQK output y"] + ["the residual"] * problem.has_residual + ["the bias"] * problem.has_bias
    label = " and ".join([", ".join(operands[:-1]), operands[-1]] if len(operands) > 1 else operands)
    return alignment_flaw(label, "K", problem.out_channels, problem.dtype)


def im2col_flaw(problem: ConvProblem) -> str | None:
    """sm_90's TMA im2col limits on pads, corners and filter offsets (the conv mainloop's
    can_implement)."""
    filter_size = (problem.kernel_h, problem.kernel_w)
    for axis in range(2):
        reach = (filter_size[axis] - 1) * problem.dilations[axis]
        if reach >= IM2COL_OFFSET_LIMIT:
            return f"dilated filter reach {reach} >= {IM2COL_OFFSET_LIMIT} (TMA im2col filter offsets)"
        lower, upper = problem.pads[axis], problem.pads[axis + 2]
        if max(lower, upper) > IM2COL_PAD_LIMIT:
            return f"pads {tuple(problem.pads)} beyond TMA im2col's {IM2COL_PAD_LIMIT}"
        if not (-IM2COL_CORNER_LIMIT <= -lower < IM2COL_CORNER_LIMIT and
                -IM2COL_CORNER_LIMIT <= upper - reach < IM2COL_CORNER_LIMIT):
            return f"pads {tuple(problem.pads)} with filter {filter_size} beyond TMA im2col's corner range"
    return None


def filter_size_flaw(problem: ConvProblem) -> str | None:
    """sm_80's optimized activation iterator: one mask bit per filter row and column."""
    if max(problem.kernel_h, problem.kernel_w) > MAX_FILTER_SIZE:
        return (f"filter {problem.kernel_h}x{problem.kernel_w} larger than {MAX_FILTER_SIZE} "
                f"(the sm80 optimized iterator's mask bits)")
    return None


def tensor_bytes_flaw(problem: ConvProblem) -> str | None:
    """sm_80's ImplicitGemmConvolution::can_implement: x, w and y each below 2^31 bytes."""
    x, w, _, _, y = problem.operand_sizes()
    for name, elements in (("x", x), ("w", w), ("y", y)):
        size = elements * ELEMENT_BITS[problem.dtype] // 8
        if size >= INT32_BYTES:
            return f"{name} of {size} bytes needs 64-bit offsets"
    return None


def sm90_conv_flaw(kernel: "ConvKernel", problem: ConvProblem) -> str | None:
    """Why the CUTLASS 3.x kernel of templates/cutlass/conv2d_sm90.cu.j2 cannot run `problem`
    (ConvUniversal::can_implement: the TMA im2col mainloop's alignment and limits, the
    epilogue's alignment), or None. It launches a CTA per tile: N of the grid within 65535."""
    flaw = conv_extents_flaw(problem) or _pixel_alignment_flaw(problem) or _output_alignment_flaw(problem) or \
        im2col_flaw(problem)
    if flaw:
        return flaw
    tiles_n = -(-(-(-problem.out_channels // kernel.tile[1])) // kernel.cluster[1]) * kernel.cluster[1]
    if tiles_n > GRID_YZ_MAX:
        return f"K={problem.out_channels} makes {tiles_n} column tiles, beyond the grid's {GRID_YZ_MAX}"
    return None


def sm80_conv_flaw(kernel: "ConvKernel", problem: ConvProblem) -> str | None:
    """Why the CUTLASS 2.x kernel of templates/cutlass/conv2d_sm80.cu.j2 cannot run `problem`
    (ImplicitGemmConvolution::can_implement: its activation and filter iterators', the tensor
    sizes, the epilogue's alignment, the grid), or None."""
    flaw = conv_extents_flaw(problem)
    if flaw:
        return flaw
    if kernel.fixed_channels:
        # the template instantiates the fixed-channel iterators for pixels of exactly the
        # problem's C channels; byoc builds the one count PadConvChannels pads stems to
        if problem.in_channels != FIXED_CHANNELS:
            return f"the fixed-channel iterator takes C={FIXED_CHANNELS}, not {problem.in_channels}"
    else:
        flaw = _pixel_alignment_flaw(problem) or filter_size_flaw(problem)
        if flaw:
            return flaw
    flaw = _output_alignment_flaw(problem) or tensor_bytes_flaw(problem)
    if flaw:
        return flaw
    tiles_n = -(-problem.out_channels // kernel.tile[1])
    if tiles_n > GRID_YZ_MAX:
        return f"K={problem.out_channels} makes {tiles_n} column tiles, beyond the grid's {GRID_YZ_MAX}"
    return None


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
# pixels), on either arch. Stems have few output channels (ResNet's 64, MobileNet's and
# EfficientNet's 16 to 32): tiles N of 64, and of 32 for the narrower ones, whose every
# CTA would otherwise compute mostly padding (the tuner measures them; the heuristic keeps
# to N of 64). A tile N of 16 does not compile: the fixed-channel filter iterator needs
# whole 32-column rows of threads.
FIXED_CHANNELS = 4
FIXED_CHANNEL_CONV_CANDIDATES = (
    ConvKernel(80, (128, 64, 64), warp=(64, 32, 64), stages=3, fixed_channels=True),
    ConvKernel(80, (128, 64, 32), warp=(64, 32, 32), stages=4, fixed_channels=True),
    ConvKernel(80, (256, 64, 32), warp=(64, 64, 32), stages=3, fixed_channels=True),
    ConvKernel(80, (64, 64, 64), warp=(32, 32, 64), stages=4, fixed_channels=True),
    ConvKernel(80, (64, 64, 32), warp=(32, 32, 32), stages=6, fixed_channels=True),
    ConvKernel(80, (256, 64, 64), warp=(64, 64, 64), stages=3, fixed_channels=True),
    ConvKernel(80, (128, 32, 32), warp=(32, 32, 32), stages=4, fixed_channels=True),
    ConvKernel(80, (256, 32, 32), warp=(64, 32, 32), stages=3, fixed_channels=True),
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
    if not allowed_kernels:
        reasons = dict.fromkeys(kernel.supports(problem) for kernel in conv_candidates(sm))
        raise ValueError(f"no sm{sm} conv kernel supports {problem.key}: {'; '.join(reasons)}")
    usable = [k for k in allowed_kernels if n > 64 or k.tile[1] == 64] or list(allowed_kernels)

    def ctas(kernel):
        return -(-m // kernel.tile[0]) * -(-n // kernel.tile[1])

    for kernel in usable:
        if ctas(kernel) >= sm_count:
            return kernel
    # a small problem: the most CTAs, and among equals the smallest tile (least padding)
    return max(usable, key=lambda kernel: (ctas(kernel), -kernel.tile[0] * kernel.tile[1]))
