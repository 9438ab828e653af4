"""MeasuredPartition: wrap the cheapest cover of main by every backend's pattern matches
into composite functions (the `partition: measured` counterpart of FuseOpsByPattern).

The candidates are every accepted match of every backend's patterns, overlapping ones
included (pattern_candidates.py), and the built-in backend's: for each match, the same
ops run by the built-in backend, and each op a match holds alone. Each costs what
`cost_of` answers (byoc/costs.py measures it, or its store knows it); an op no match holds
runs on the built-in backend whatever is chosen, at no cost to the choice. The cheapest
cover of main's bindings by those candidates (cheapest_cover.py, Collage's search) is
chosen, and each chosen match becomes a composite function exactly as FuseOpsByPattern
would have made it; the built-in backend's choices stay ops of main for its own
partitioning (`finalize`).

    %matmul_bias = fn (%p0, %p1, %p2) [Composite="cublaslt.dense_bias", Primitive=1] {...}
    %y = %matmul_bias(%x, meta[0], meta[1])      (cublaslt: 41.0 us; builtin 57.3 us)

Where a candidate's cost cannot be had (`cost_of` answers None: no GPU to measure on and
nothing stored), its region (the ops it and the matches overlapping it hold) takes the
choice of the priority order (FuseOpsByPattern's matches, reproduced from the candidate
list), and the rest is chosen by cost. Returns None, main left alone, where no cover can
be chosen (a search past its state limit, a cycle); the report says why, and the caller
partitions by priority.
"""
from __future__ import annotations

from ..ir.expr import Function
from ..ir.module import IRModule
from .cheapest_cover import Candidate, CoverError, cheapest_cover, joined_groups, reach_edges
from .fuse_ops_by_pattern import _Matcher, _wrap_matches
from .pattern_candidates import dataflow_edges, pattern_candidates

BUILTIN = "builtin"


def measured_partition(mod: IRModule, backend_names: list, cost_of, report, max_states: int = 200_000):
    """`cost_of(mod, requests)`: requests are (backend, name, nodes) triples (nodes: binding
    positions of main); answers a list of microseconds, None where the cost cannot be had,
    or a str saying why the candidate cannot run (it is then left out)."""
    from ..backend import get_backend
    main = mod["main"]
    bindings = list(main.bindings)
    matches = pattern_candidates(mod, backend_names)
    contested = sorted({node for match in matches for node in match.nodes})
    if not contested:
        report.note_measurement("partition: measured: no backend's pattern matches any op; nothing to choose")
        return mod
    requests = [(m.backend, m.pattern, m.nodes) for m in matches]
    # the built-in backend's alternative to each match: its ops, once per set of ops (two
    # backends' matches of the same ops, or a match of one op, ask for the same candidate)
    builtin = {}
    for m in matches:
        builtin.setdefault(m.nodes, (BUILTIN, "ops of " + m.pattern, m.nodes))
    for node in contested:
        builtin.setdefault(frozenset([node]), (BUILTIN, "op", frozenset([node])))
    requests += list(builtin.values())
    answers = cost_of(mod, requests)
    # Where a candidate has no cost (nothing stored, nothing to measure on), its region (the
    # ops its and overlapping matches hold) takes the priority order's choice; the rest is
    # chosen by cost.
    region_of = _regions(contested, matches)
    unknown = {region_of[min(nodes)] for (_, _, nodes), answer in zip(requests, answers) if answer is None}
    if unknown:
        forced = _priority_choice(matches)
        requests, answers = _forced(requests, answers, region_of, unknown, forced, contested)
        ops = sum(1 for node in contested if region_of[node] in unknown)
        report.note_measurement(f"partition: measured: {len(unknown)} of {len(set(region_of.values()))} regions "
                                f"({ops} ops) have candidates without a cost (nothing stored for the target, and "
                                f"no GPU of its arch, or no CuPy, to measure them on): the priority order there")
    # The search runs over the contested ops only (an op no match holds is the built-in
    # backend's whatever is chosen): their positions renumbered 0.., an edge wherever one
    # reaches another directly or through uncontested ops (what a cycle could pass through).
    index = {node: number for number, node in enumerate(contested)}
    candidates, failed = [], []
    for request, answer in zip(requests, answers):
        backend, name, nodes = request
        if isinstance(answer, str):
            failed.append((request, answer))
            continue
        candidates.append(Candidate(backend, frozenset(index[n] for n in nodes), float(answer), name))
    try:
        cover = cheapest_cover(len(contested), contested_edges(len(bindings), dataflow_edges(mod), index),
                               candidates, max_states=max_states)
    except CoverError as error:
        report.note_measurement(f"partition: measured fell back to the priority order: {error}")
        return None
    # each chosen match wrapped as FuseOpsByPattern wraps one
    matcher = _Matcher(bindings, main)
    entries = {(b, e.name): e for b in backend_names for e in get_backend(b).patterns}
    by_nodes = {(m.backend, m.pattern, m.nodes): m for m in matches}
    chosen = []
    for candidate in cover.candidates:
        match = by_nodes.get((candidate.backend, candidate.name, frozenset(contested[n] for n in candidate.nodes)))
        if match is None:
            continue  # the built-in backend's: its ops stay in main
        entry = entries[(match.backend, match.pattern)]
        root = bindings[match.root].var
        found = next((found for found in matcher.matches(entry, root)
                      if frozenset(matcher.position_of[v] for v in found.matched) == match.nodes
                      and matcher.refusal(entry, root, found) is None), None)
        if found is None:  # (pattern_candidates listed it from the same matcher: never)
            report.note_measurement(f"partition: measured fell back to the priority order: the match "
                                    f"{match.backend}.{match.pattern} at %{root.name_hint} was not found again")
            return None
        chosen.append((root, found, f"{match.backend}.{match.pattern}"))
    for root, found, composite in chosen:
        backend, pattern = composite.split(".", 1)
        report.accept(backend, pattern, [bindings[matcher.position_of[v]].value.op.name for v in found.matched])
    for (backend, name, nodes), reason in failed:
        root = bindings[max(nodes)]
        report.refuse(backend, name, root.value.op.name, f"measuring it failed: {reason}", node=root.var.name_hint)
    report.record_cover(cover, [bindings[node].var.name_hint for node in contested])
    result = mod.copy()
    result["main"] = Function(main.params, _wrap_matches(bindings, chosen), main.result, main.ret_type, main.attrs)
    return result


def contested_edges(num_nodes: int, edges: list, index: dict) -> list:
    """The edges between the nodes `index` renumbers (node -> its number): one from a to b
    wherever a reaches b directly or through nodes `index` leaves out only."""
    successors = [[] for _ in range(num_nodes)]
    for producer, consumer in edges:
        successors[producer].append(consumer)
    return reach_edges(successors, index)


def _regions(contested: list, matches: list) -> dict:
    """node -> its region: the contested ops joined by the matches that hold them together."""
    return joined_groups(contested, [match.nodes for match in matches])


def _priority_choice(matches: list) -> list:
    """The matches FuseOpsByPattern takes, from pattern_candidates' list (which is in its
    order: backends, their entries, roots from the last binding): each that overlaps none
    taken before it."""
    taken, claimed = [], set()
    for match in matches:
        if not match.nodes & claimed:
            taken.append(match)
            claimed |= match.nodes
    return taken


def _forced(requests: list, answers: list, region_of: dict, unknown: set, forced: list, contested: list):
    """The requests and answers with the regions in `unknown` reduced to the priority
    order's choice there (`forced` matches, and each op they leave alone on the built-in
    backend), at no cost: nothing else can be placed there."""
    kept = [(request, answer) for request, answer in zip(requests, answers)
            if region_of[min(request[2])] not in unknown]
    covered = set()
    for match in forced:
        if region_of[min(match.nodes)] in unknown:
            kept.append(((match.backend, match.pattern, match.nodes), 0.0))
            covered |= match.nodes
    kept += [((BUILTIN, "op", frozenset([node])), 0.0) for node in contested
             if region_of[node] in unknown and node not in covered]
    return [request for request, _ in kept], [answer for _, answer in kept]
