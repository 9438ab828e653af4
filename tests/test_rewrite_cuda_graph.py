"""RewriteCUDAGraph on IR text: regions end at non-capturable calls; views launch nothing."""
from byoc.ir import assert_structural_equal, parse
from byoc.transform.rewrite_cuda_graph import rewrite_cuda_graph

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
