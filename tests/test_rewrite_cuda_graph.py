"""RewriteCUDAGraph on IR text: regions end at non-capturable calls (a cpu function, a copy
between memories); views launch nothing."""
from byoc.ir import assert_structural_equal, parse
from byoc.transform.rewrite_cuda_graph import graph_regions, rewrite_cuda_graph

T = "Tensor[(64,), float32]"
DECLS = f"""
def @k1(%a: {T}) -> {T} [Extern=1];
def @k2(%a: {T}, %b: {T}) -> {T} [Extern=1];
def @sync(%a: {T}) -> {T} [Extern=1];
"""


def capturable(symbol):
    return symbol != "sync"  # @sync stands for a call that synchronizes with the host


def test_region_ends_at_non_capturable_call_and_two_regions():
    before = parse(f"""
def @main(%x: {T}) -> {T} {{
  %a = @k1(%x)
  %b = @k2(%a, %x)
  %s = @sync(%b)
  %c = @k1(%s)
  %d = @k2(%c, %a)
  return %d
}}
{DECLS}""")
    expected = parse(f"""
def @main(%x: {T}) -> {T} {{
  %r0 = @cuda_graph_0(%x)
  %a = %r0.0
  %b = %r0.1
  %s = @sync(%b)
  %d = @cuda_graph_1(%s, %a)
  return %d
}}
def @cuda_graph_0(%p0: {T}) -> Tuple[{T}, {T}] [CUDAGraph=1] {{
  %a = @k1(%p0)
  %b = @k2(%a, %p0)
  return (%a, %b)
}}
def @cuda_graph_1(%p0: {T}, %p1: {T}) -> {T} [CUDAGraph=1] {{
  %c = @k1(%p0)
  %d = @k2(%c, %p1)
  return %d
}}
{DECLS}""")
    assert_structural_equal(rewrite_cuda_graph(before, capturable), expected)


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


# What PlanDevices leaves for a cuda build with host inputs and outputs and a function on
# the cpu: the copies and the cpu function run between two regions.
DEVICE_DECLS = f"""
def @gpu(%a: {T}) -> {T} [Extern=1];
def @host(%a: {T}) -> {T} [Extern=1];
"""


def on_gpu(symbol):
    return symbol != "host"  # the builder refuses functions placed on the cpu


def test_two_device_regions_around_a_cpu_function_with_host_inputs_and_outputs():
    before = parse(f"""
def @main(%x: {T}) -> {T} {{
  %x_cuda = device_copy(%x, src="cpu", dst="cuda")
  %a = @gpu(%x_cuda)
  %b = @gpu(%a)
  %b_cpu = device_copy(%b, src="cuda", dst="cpu")
  %s = @host(%b_cpu)
  %s_cuda = device_copy(%s, src="cpu", dst="cuda")
  %c = @gpu(%s_cuda)
  %d = @gpu(%c)
  %d_cpu = device_copy(%d, src="cuda", dst="cpu")
  return %d_cpu
}}
{DEVICE_DECLS}""")
    expected = parse(f"""
def @main(%x: {T}) -> {T} {{
  %x_cuda = device_copy(%x, src="cpu", dst="cuda")
  %b = @cuda_graph_0(%x_cuda)
  %b_cpu = device_copy(%b, src="cuda", dst="cpu")
  %s = @host(%b_cpu)
  %s_cuda = device_copy(%s, src="cpu", dst="cuda")
  %d = @cuda_graph_1(%s_cuda)
  %d_cpu = device_copy(%d, src="cuda", dst="cpu")
  return %d_cpu
}}
def @cuda_graph_0(%p0: {T}) -> {T} [CUDAGraph=1] {{
  %a = @gpu(%p0)
  %b = @gpu(%a)
  return %b
}}
def @cuda_graph_1(%p0: {T}) -> {T} [CUDAGraph=1] {{
  %c = @gpu(%p0)
  %d = @gpu(%c)
  return %d
}}
{DEVICE_DECLS}""")
    assert_structural_equal(rewrite_cuda_graph(before, on_gpu), expected)
    assert graph_regions(before, on_gpu) == [[1, 2], [6, 7]]


def test_every_function_on_the_cpu_leaves_no_region():
    before = parse(f"""
def @main(%x: {T}) -> {T} {{
  %a = @host(%x)
  %b = @host(%a)
  return %b
}}
{DEVICE_DECLS}""")
    assert graph_regions(before, on_gpu) == []
    assert_structural_equal(rewrite_cuda_graph(before, on_gpu), before)
