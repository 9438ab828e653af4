"""pattern_candidates: every backend's pattern matches in main, overlapping ones included.

What partitioning by measurement chooses among (byoc/transform/cheapest_cover.py): where
FuseOpsByPattern takes the backends in priority order and a match may not overlap one
already taken, this lists every match that FuseOpsByPattern's other checks accept (no
cycle through an outside node, no intermediate used outside the match, the entry's own
check), each with the binding positions it covers; dataflow_edges gives the edges between
those positions. Leaves the module alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.module import IRModule
from .bindings import BindingIndex
from .fuse_ops_by_pattern import _Matcher


@dataclass(frozen=True)
class PatternCandidate:
    """One match main's bindings could become a function of: `backend`'s entry `pattern`
    rooted at binding `root`, over the bindings at positions `nodes`."""
    backend: str
    pattern: str
    root: int
    nodes: frozenset


def pattern_candidates(mod: IRModule, backend_names: list) -> list:
    """Every accepted match of every entry of the backends' pattern tables in main (each
    root's different matches too: add(x, y) in either argument order), in priority order
    (backends, then each table's entries, then roots from the last binding to the first)."""
    from ..backend import get_backend
    main = mod["main"]
    bindings = list(main.bindings)
    matcher = _Matcher(bindings, main)
    found_all = []
    for backend_name in backend_names:
        backend = get_backend(backend_name)
        for entry in backend.patterns:
            for position in range(len(bindings) - 1, -1, -1):
                root = bindings[position].var
                if root not in matcher.producers:
                    continue
                seen = set()
                for found in matcher.matches(entry, root):
                    nodes = frozenset(matcher.position_of[var] for var in found.matched)
                    if nodes in seen or matcher.refusal(entry, root, found) is not None:
                        continue
                    seen.add(nodes)
                    found_all.append(PatternCandidate(backend.name, entry.name, position, nodes))
    return found_all


def dataflow_edges(mod: IRModule) -> list:
    """(producer, consumer) binding positions of main: binding `consumer` reads the var
    binding `producer` defines (the graph cheapest_cover searches)."""
    index = BindingIndex(mod["main"])
    return sorted({(index.producers[var][0], reader) for var, readers in index.uses.items()
                   if var in index.producers for reader in readers
                   if reader < len(index.bindings) and reader != index.producers[var][0]})
