"""RewriteCUDAGraph on IR text (before / after), after PlanMemory: regions are runs of
capturable calls on static device storage; they end at a cpu function, a copy between
memories, a call whose result is in host memory or has no storage; views launch nothing."""
from byoc.ir import assert_structural_equal, parse
from byoc.transform.plan_memory import plan_memory
from byoc.transform.rewrite_cuda_graph import graph_regions, mark_graph_regions, region_breaks, rewrite_cuda_graph

T = "Tensor[(64,), float32]"
DECLS = f"""
def @k1(%a: {T}) -> {T} [Extern=1];
def @k2(%a: {T}, %b: {T}) -> {T} [Extern=1];
def @sync(%a: {T}) -> {T} [Extern=1];
"""


def capturable(symbol):
    return symbol != "sync"  # @sync stands for a call that synchronizes with the host


STORAGE = "[storage_bytes=[768], storage_lower_bound=[768], storage_no_reuse=[1024], storage_spaces=[\"cuda\"]]"


def test_region_ends_at_non_capturable_call_and_two_regions():
    before = parse(f"""
def @main(%x: {T}) -> {T} {STORAGE} {{
  %a = @k1(%x, offset=0, size=256, storage="cuda")
  %b = @k2(%a, %x, offset=256, size=256, storage="cuda")
  %s = @sync(%b, offset=512, size=256, storage="cuda")
  %c = @k1(%s, offset=256, size=256, storage="cuda")
  %d = @k2(%c, %a, output=0, storage="output")
  return %d
}}
{DECLS}""")
    unplanned = parse(before.script().replace(STORAGE, ""))
    for binding in unplanned["main"].bindings:
        binding.value.attrs.clear()
    assert_structural_equal(plan_memory(unplanned, default_device="cuda"), before)
    expected = parse(f"""
def @main(%x: {T}) -> {T} {STORAGE} {{
  %r0 = @cuda_graph_0(%x)
  %a = %r0.0
  %b = %r0.1
  %s = @sync(%b, offset=512, size=256, storage="cuda")
  %d = @cuda_graph_1(%s, %a)
  return %d
}}
def @cuda_graph_0(%p0: {T}) -> Tuple[{T}, {T}] [CUDAGraph=1] {{
  %a = @k1(%p0, offset=0, size=256, storage="cuda")
  %b = @k2(%a, %p0, offset=256, size=256, storage="cuda")
  return (%a, %b)
}}
def @cuda_graph_1(%p0: {T}, %p1: {T}) -> {T} [CUDAGraph=1] {{
  %c = @k1(%p0, offset=256, size=256, storage="cuda")
  %d = @k2(%c, %p1, output=0, storage="output")
  return %d
}}
{DECLS}""")
    assert_structural_equal(rewrite_cuda_graph(before, capturable), expected)
    assert region_breaks(before, capturable) == [(2, "%s: @sync is declared not capturable")]


def test_calls_without_static_storage_or_writing_host_memory_are_not_captured():
    """A call PlanMemory gave no storage, and one whose result it put in host memory, run
    between regions; the build is told why."""
    before = parse(f"""
def @main(%x: {T}) -> {T} {{
  %a = @k1(%x, offset=0, size=256, storage="cuda")
  %b = @k1(%a)
  %c = @k1(%b, offset=0, size=256, storage="cpu")
  %d = @k1(%c, output=0, storage="output")
  return %d
}}
{DECLS}""")
    assert graph_regions(before, capturable) == [[0], [3]]
    assert region_breaks(before, capturable) == [
        (1, "%b: @k1's result has no static storage (PlanMemory did not place it)"),
        (2, "%c: @k1 writes host memory (cpu)")]


def test_block_without_kernels_is_left_alone():
    before = parse(f"""
def @main(%x: {T}) -> Tuple[{T}, {T}] {{
  %t = (%x, %x)
  return %t
}}
{DECLS}""")
    assert_structural_equal(rewrite_cuda_graph(before, capturable), before)


def test_only_non_capturable_calls():
    before = parse(f"""
def @main(%x: {T}) -> {T} {{
  %s = @sync(%x)
  return %s
}}
{DECLS}""")
    assert_structural_equal(rewrite_cuda_graph(before, capturable), before)


# What PlanDevices and PlanMemory leave for a cuda build with host inputs and outputs and a
# function on the cpu (tests/test_plan_memory.py: HOST_IO_PLANNED): the copies and the cpu
# function run between two regions.
T4 = "Tensor[(4,), float32]"
DEVICE_DECLS = f"""
def @gpu(%p: {T4}) -> {T4} [Extern=1];
def @host(%p: {T4}) -> {T4} [Extern=1];
"""
HOST_STORAGE = ('[storage_bytes=[512, 512], storage_lower_bound=[512, 512], storage_no_reuse=[512, 1536], '
                'storage_spaces=["cpu/host-pinned", "cuda"]]')


def on_gpu(symbol):
    return symbol != "host"  # the builder refuses functions placed on the cpu


def test_two_device_regions_around_a_cpu_function_with_host_inputs_and_outputs():
    from test_plan_memory import HOST_IO_PLANNED  # what PlanMemory makes of that model
    before = parse(HOST_IO_PLANNED)
    expected = parse(f"""
def @main(%x: {T4}) -> {T4} {HOST_STORAGE} {{
  %x_cuda = device_copy(%x, src="cpu", dst="cuda", storage="cuda", offset=0, size=16)
  %b = @cuda_graph_0(%x_cuda)
  %b_cpu = device_copy(%b, src="cuda", dst="cpu/host-pinned", storage="cpu/host-pinned", offset=0, size=16)
  %s = @host(%b_cpu, offset=256, size=16, storage="cpu/host-pinned")
  %s_cuda = device_copy(%s, src="cpu/host-pinned", dst="cuda", storage="cuda", offset=0, size=16)
  %d = @cuda_graph_1(%s_cuda)
  %d_cpu = device_copy(%d, src="cuda", dst="cpu", output=0, storage="output")
  return %d_cpu
}}
def @cuda_graph_0(%p0: {T4}) -> {T4} [CUDAGraph=1] {{
  %a = @gpu(%p0, offset=256, size=16, storage="cuda")
  %b = @gpu(%a, offset=0, size=16, storage="cuda")
  return %b
}}
def @cuda_graph_1(%p0: {T4}) -> {T4} [CUDAGraph=1] {{
  %c = @gpu(%p0, offset=256, size=16, storage="cuda")
  %d = @gpu(%c, offset=0, size=16, storage="cuda")
  return %d
}}
{DEVICE_DECLS}""")
    assert_structural_equal(rewrite_cuda_graph(before, on_gpu), expected)
    assert graph_regions(before, on_gpu) == [[1, 2], [6, 7]]
    assert [index for index, _ in region_breaks(before, on_gpu)] == [0, 3, 4, 5, 8]


def test_every_function_on_the_cpu_leaves_no_region():
    before = parse(f"""
def @main(%x: {T4}) -> {T4} {{
  %a = @host(%x, offset=0, size=16, storage="cpu")
  %b = @host(%a, output=0, storage="output")
  return %b
}}
{DEVICE_DECLS}""")
    assert graph_regions(before, on_gpu) == []
    assert_structural_equal(rewrite_cuda_graph(before, on_gpu), before)


def test_regions_marked_on_their_calls_are_what_the_build_keeps():
    """mark_graph_regions: the same regions as graph_region=n on each call (the form the
    host plan reads), the calls between regions left alone."""
    before = parse(f"""
def @main(%x: {T}) -> {T} {STORAGE} {{
  %a = @k1(%x, offset=0, size=256, storage="cuda")
  %b = @k2(%a, %x, offset=256, size=256, storage="cuda")
  %s = @sync(%b, offset=512, size=256, storage="cuda")
  %d = @k2(%s, %a, output=0, storage="output")
  return %d
}}
{DECLS}""")
    expected = parse(f"""
def @main(%x: {T}) -> {T} {STORAGE} {{
  %a = @k1(%x, graph_region=0, offset=0, size=256, storage="cuda")
  %b = @k2(%a, %x, graph_region=0, offset=256, size=256, storage="cuda")
  %s = @sync(%b, offset=512, size=256, storage="cuda")
  %d = @k2(%s, %a, graph_region=1, output=0, storage="output")
  return %d
}}
{DECLS}""")
    assert_structural_equal(mark_graph_regions(before, graph_regions(before, capturable)), expected)
    assert mark_graph_regions(before, []) is before
