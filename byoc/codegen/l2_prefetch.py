"""When the host prefetches weights into the GPU's L2 cache, and which.

A GEMM or a convolution reads every byte of its weights once per run, and by the next run
(or already a few layers later) they are out of L2 again, so the call begins by streaming
them from HBM. The calls between two such readers (layer norms, attention, elementwise
kernels) are bound by latency and leave HBM idle. Prefetching a reader's weights beside
the calls before it moves that traffic into the idle time: the reader then finds them in
L2. TensorRT and inference runtimes overlap weight traffic the same way.

plan_l2_prefetch chooses, for each call whose backend reads its constants whole
(Artifact.streamed_constants), the call before which its prefetch starts: as far ahead as
LOOKAHEAD calls, but never so far that the weights prefetched and not yet read exceed the
budget (a fraction of L2: more would evict what the calls in between are using). The host
(templates/host/model.cc.j2) runs each prefetch on a second stream forked from the calls'
stream at that point, only while it captures the CUDA graph, so that the graph holds the
prefetches as branches beside the calls; byoc/runtime/cuda/l2_prefetch.cu is the kernel.
"""
from __future__ import annotations

# A prefetch is worth its branch only for weights this large (a GEMM's, a conv's).
MIN_BYTES = 64 << 10
# How many calls ahead of its reader a prefetch may start.
LOOKAHEAD = 4
# The prefetch instruction takes whole 16-byte blocks.
GRANULE = 16


def plan_l2_prefetch(calls: list, streamed_symbols, budget_bytes: int) -> int:
    """Adds `prefetch` entries ({"address", "bytes", "reader"}) to the calls of a host plan
    (byoc/codegen/host.py: plan_host) before which a prefetch starts. `streamed_symbols`:
    extern symbols whose calls read all of their constant operands. Returns the number of
    prefetches planned (none with a budget of 0)."""
    if budget_bytes <= 0:
        return 0
    streamed_symbols = set(streamed_symbols)
    wanted = {}  # call index -> [(address, bytes)]
    for index, call in enumerate(calls):
        if call.get("kind") != "call" or call.get("symbol") not in streamed_symbols:
            continue
        ranges = [(address, size - size % GRANULE) for address, size in call.get("constants", [])
                  if size >= MIN_BYTES]
        if ranges and sum(size for _, size in ranges) <= budget_bytes:
            wanted[index] = ranges
    planned = 0
    earliest = 0  # prefetches start in the order of their readers
    for reader, ranges in wanted.items():
        start = max(earliest, reader - LOOKAHEAD)
        # the weights of every reader in (start, reader] that is prefetched stay in L2 together
        while start < reader and (not _launches_kernels(calls[start]) or sum(
                size for index, rs in wanted.items() if start < index <= reader for _, size in rs) > budget_bytes):
            start += 1
        if start >= reader:
            continue
        for address, size in ranges:
            calls[start].setdefault("prefetch", []).append(
                {"address": address, "bytes": size, "reader": calls[reader]["label"]})
            planned += 1
        earliest = start
    return planned


def _launches_kernels(call) -> bool:
    """A GPU call (not a copy, not a cpu function): a fork point in the captured stream."""
    return call.get("kind") == "call" and not call.get("on_host")
