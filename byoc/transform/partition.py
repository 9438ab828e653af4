"""partition_for: the whole partitioning pipeline for a list of backends.

`claims_first` (the blocks a backend runs as one kernel and no other offers) ->
FuseOpsByPattern (backends in priority order), or MeasuredPartition (the cheapest cover by
the candidates' costs: partition: measured) -> MergeCompositeFunctions -> `finalize`
(the built-in backend's partitioning of every op left) -> OutlineCompilerFunctions ->
DeadCodeElimination, with a PartitionReport filled in on the way.
"""
from __future__ import annotations

from ..ir.module import IRModule
from ..report import PartitionReport
from .dead_code_elimination import dead_code_elimination
from .fuse_ops_by_pattern import fuse_ops_by_pattern
from .measured_partition import measured_partition
from .merge_composite_functions import merge_composite_functions
from .outline_compiler_functions import outline_compiler_functions


def partition_for(mod: IRModule, backend_names: list, finalize=None, symbol_suffix: str = "", claims_first=(),
                  cost_of=None, unshared=()) -> tuple[IRModule, PartitionReport]:
    """`cost_of` (partition: measured; see MeasuredPartition): the backends' matches are
    chosen by cost, not taken in priority order, unless no cover can be chosen. `unshared`:
    backends whose equal functions stay one per call (OutlineCompilerFunctions)."""
    report = PartitionReport()
    for claim in claims_first:
        mod = claim(mod, report)
    chosen = measured_partition(mod, backend_names, cost_of, report) if cost_of is not None else None
    mod = chosen if chosen is not None else fuse_ops_by_pattern(mod, backend_names, report)
    mod = merge_composite_functions(mod)
    if finalize is not None:
        mod = finalize(mod)
    mod = outline_compiler_functions(mod, symbol_suffix, unshared)
    mod = dead_code_elimination(mod)
    report.count_functions(mod)
    _count_builtin_ops(mod, report)
    return mod, report


def _count_builtin_ops(mod, report):
    from ..ir.expr import Call, GlobalVar
    from ..ir.op import Op
    calls = {}
    for binding in mod["main"].bindings:
        value = binding.value
        if isinstance(value, Call) and isinstance(value.op, GlobalVar):
            calls[value.op.name] = calls.get(value.op.name, 0) + 1
    for name, count in calls.items():
        function = mod[name]
        if function.attrs.get("Compiler") != "builtin" or not function.bindings:
            continue
        ops = [b.value.op.name for b in function.bindings if isinstance(b.value, Call) and isinstance(b.value.op, Op)]
        for op in ops:
            report.ops["builtin"][op] += count
        # A builtin function that runs several ops as one kernel (an elementwise group, a
        # layout chain, a depthwise conv with its epilogue) is a composite of the builtin
        # backend: the report counts it under its kind.
        composite = str(function.attrs.get("Composite", ""))
        if len(ops) > 1 and composite.startswith("builtin."):
            report.accepted["builtin"][composite[len("builtin."):]] += count
