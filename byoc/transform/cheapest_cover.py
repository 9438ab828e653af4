"""cheapest_cover: which backend runs which ops, chosen by cost (the search of Collage:
Jeon et al., PACT 2022; TVM RFC 0062).

The graph is main's bindings as nodes 0..n-1 in their (topological) order, with the
dataflow edges between them. A candidate is one way to run some of them as one kernel or
function: a backend's pattern match (overlapping ones included: CUTLASS's dense+bias+GELU
and cuBLASLt's dense+bias over the same matmul are two candidates) or one op alone, with
its cost in microseconds (measured on the GPU, or read from the cost store). A cover takes
candidates that cover every node exactly once; its cost is theirs plus each boundary's:
for every edge whose producer and consumer are in different candidates,
`boundary_cost(producer's candidate, consumer's candidate, producer, consumer)` (a copy, a
layout or dtype change, a fusion lost by cutting there). The cheapest cover is found by
dynamic programming over the nodes in order, as Collage searches: a state is the set of
nodes covered so far, and the next step covers the first node not yet covered with a
candidate that holds it and nothing covered. Each cover is reached in exactly one order,
so the search enumerates covers, not permutations, and states reached along different
paths are solved once. A state also carries what the rest of the search depends on: which
candidate covers each covered node that still has an uncovered neighbour (the frontier:
the boundary costs still to come depend on it), and which frontier nodes reach which
through the covered nodes, each placed candidate counted as one node (a cycle a later
candidate would close enters and leaves the covered nodes at the frontier).

Ties (equal cost within 1e-9, relative above 1 us) go to the candidate listed first for
the first uncovered node. That is not the choice priority partitioning makes
(FuseOpsByPattern lets a higher backend claim first, its roots from the last binding
back): a caller that wants today's cover on a tie keeps it unless this one is cheaper.

Each placement of the chosen cover comes with the alternatives the search weighed there
(Cover.decisions): every other candidate for that node, with the cost of the cheapest
whole cover that places it there, or why none does; the partition report shows them.

A cover must also be schedulable: with each chosen candidate one node, the graph must stay
acyclic (two candidates, each convex, can still need each other: {a, d} and {b, c} with
a -> b and c -> d). A candidate that would close a cycle with those already placed is
skipped; the chosen cover is checked once more as a whole.

Raises CoverError (a BuildError) naming the node or candidate for: a node no candidate
covers, a candidate outside the graph, empty, or of a negative or non-finite cost, no
exact cover (candidates that overlap) or none that can be scheduled, or a search past
`max_states` states (the caller then partitions by priority order and says so).
"""
from __future__ import annotations

import functools
import math
import numbers
import operator
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..errors import BuildError

TIE_TOLERANCE = 1e-9


class CoverError(BuildError):
    """No cover of the graph by the candidates could be chosen (the message says why)."""


@dataclass(frozen=True)
class Candidate:
    """One way to run some of the graph's nodes as one function: `backend`'s pattern
    `name` (or one op), covering `nodes`, costing `cost_us` microseconds a run."""
    backend: str
    nodes: frozenset
    cost_us: float
    name: str = ""

    def describe(self) -> str:
        return f"{self.backend}:{self.name or 'op'} over nodes {sorted(self.nodes)} ({self.cost_us:g} us)"


@dataclass(frozen=True)
class Alternative:
    """A candidate the search weighed for a node: the cost of the cheapest whole cover that
    places it there, or None with the reason there is none; `cover`: that cover's candidates
    (where it has a cost), which a search by parts checks against the other parts'."""
    candidate: Candidate
    cost_us: float | None
    why_not: str = ""
    cover: tuple = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Decision:
    """One placement of the chosen cover: the candidate chosen for `node` (the first node
    not yet covered there) and the other candidates for it, cheapest first."""
    node: int
    chosen: Candidate
    cost_us: float
    alternatives: tuple

    def describe(self) -> str:
        others = "; ".join(f"{a.candidate.backend}:{a.candidate.name or 'op'} "
                           + (f"{a.cost_us:g} us" if a.cost_us is not None else a.why_not)
                           for a in self.alternatives) or "no other candidate"
        return (f"node {self.node}: {self.chosen.backend}:{self.chosen.name or 'op'} (whole cover "
                f"{self.cost_us:g} us) over {others}")


@dataclass
class Cover:
    """The chosen candidates (in the order the search placed them: by first node), the
    boundaries charged between them as (producer, consumer, cost), the total cost, and
    the alternatives weighed at each placement."""
    candidates: list
    boundaries: list = field(default_factory=list)
    cost_us: float = 0.0
    decisions: list = field(default_factory=list)

    def candidate_of(self) -> dict:
        """node -> the chosen candidate that covers it."""
        return {node: candidate for candidate in self.candidates for node in candidate.nodes}


def cheapest_cover(num_nodes: int, edges: Iterable, candidates: Sequence[Candidate],
                   boundary_cost: Callable[[Candidate, Candidate, int, int], float] | None = None,
                   max_states: int = 200_000) -> Cover:
    """The cheapest cover of nodes 0..num_nodes-1 (edges: (producer, consumer) pairs) by
    `candidates`; see the module docstring."""
    successors = [set() for _ in range(num_nodes)]
    predecessors = [set() for _ in range(num_nodes)]
    for producer, consumer in edges:
        if not (0 <= producer < num_nodes and 0 <= consumer < num_nodes) or producer == consumer:
            raise CoverError(f"cheapest cover: edge {producer} -> {consumer} is not between two of the graph's "
                             f"{num_nodes} nodes")
        successors[producer].add(consumer)
        predecessors[consumer].add(producer)
    for candidate in candidates:
        _check_candidate(candidate, num_nodes)
    covering = [False] * num_nodes
    for candidate in candidates:
        for node in candidate.nodes:
            covering[node] = True
    for node, covered in enumerate(covering):
        if not covered:
            raise CoverError(f"cheapest cover: no candidate covers node {node}")
    if boundary_cost is None:
        # Without boundary costs, the parts of the graph no candidate joins are chosen on
        # their own: a whole-graph state would carry every finished part's frontier choices
        # into the next (ConvNeXt-T's residual blocks passed 200,000 states that way).
        cover = _cover_by_components(num_nodes, successors, candidates, max_states)
        if cover is not None:
            return cover
    # a candidate can be placed when its first node is the first uncovered one: index the
    # candidates by every node they hold, tried in the order given (the priority order)
    holding: list[list[int]] = [[] for _ in range(num_nodes)]
    for index, candidate in enumerate(candidates):
        for node in candidate.nodes:
            holding[node].append(index)
    search = _Search(num_nodes, successors, predecessors, list(candidates), holding,
                     boundary_cost or (lambda *_: 0.0), max_states)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * num_nodes + 1000))  # a frame a placed candidate, and headroom
    try:
        cost, choices = search.best(0, (), ())
    finally:
        sys.setrecursionlimit(limit)
    if choices is None and search.refused_cycles:
        raise CoverError("cheapest cover: no cover of the graph by these candidates can be scheduled (every "
                         "exact cover has candidates that need each other: a cycle)")
    if choices is None:
        raise CoverError("cheapest cover: no set of these candidates covers every node exactly once (they "
                         "overlap)")
    chosen = [candidates[index] for index in choices]
    if _has_cycle(chosen, num_nodes, successors):
        raise CoverError("cheapest cover: the chosen candidates need each other (a cycle): "
                         + "; ".join(c.describe() for c in chosen))
    return Cover(chosen, _boundaries(chosen, successors, search.boundary_cost), cost, search.decisions(choices))


def _cover_by_components(num_nodes: int, successors: list, candidates: Sequence[Candidate],
                         max_states: int) -> Cover | None:
    """The cheapest cover chosen component by component (nodes joined by candidates that
    hold them together; edges between a component's nodes wherever one reaches another
    through nodes outside it), or None where there is one component, or where the covers
    chosen so need each other (a cycle through several components): the whole search then."""
    group_of = joined_groups(range(num_nodes), [candidate.nodes for candidate in candidates])
    components: dict = {}
    for node in range(num_nodes):
        components.setdefault(group_of[node], []).append(node)
    if len(components) < 2:
        return None
    covers = []
    for nodes in components.values():
        number = {node: position for position, node in enumerate(nodes)}
        own = [c for c in candidates if min(c.nodes) in number]
        local = [Candidate(c.backend, frozenset(number[n] for n in c.nodes), c.cost_us, c.name) for c in own]
        original = dict(zip(local, own))
        cover = cheapest_cover(len(nodes), reach_edges(successors, number), local, max_states=max_states)
        covers.append((nodes, original, cover))
    chosen = [original[c] for _, original, cover in covers for c in cover.candidates]
    if _has_cycle(chosen, num_nodes, successors):
        return None
    total = sum(cover.cost_us for _, _, cover in covers)
    decisions = []
    for nodes, original, cover in covers:
        others = total - cover.cost_us  # a decision's costs are whole covers': the other parts' added
        chosen_elsewhere = [c for _, other_original, other in covers if other is not cover
                            for c in (other_original[local] for local in other.candidates)]

        def whole(alternative):
            """The alternative in the whole graph: its part's cover with it beside the other
            parts' chosen covers, which it may need in a cycle (then it has no cost here)."""
            if alternative.cost_us is None:
                return Alternative(original[alternative.candidate], None, alternative.why_not)
            if _has_cycle(chosen_elsewhere + [original[c] for c in alternative.cover], num_nodes, successors):
                return Alternative(original[alternative.candidate], None, "would close a cycle through another part")
            return Alternative(original[alternative.candidate], alternative.cost_us + others)
        for decision in cover.decisions:
            alternatives = tuple(sorted((whole(a) for a in decision.alternatives),
                                        key=lambda a: (a.cost_us is None, a.cost_us or 0.0)))
            decisions.append(Decision(nodes[decision.node], original[decision.chosen], decision.cost_us + others,
                                      alternatives))
    decisions.sort(key=lambda decision: decision.node)
    chosen.sort(key=lambda candidate: min(candidate.nodes))
    return Cover(chosen, _boundaries(chosen, successors, lambda *_: 0.0), total, decisions)


def joined_groups(nodes, node_sets) -> dict:
    """node -> its group: `nodes` joined wherever one of `node_sets` holds two of them
    together (a union-find; each group named by one of its nodes)."""
    parent = {node: node for node in nodes}

    def root(node):
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node
    for held in node_sets:
        first, *rest = sorted(held)
        for node in rest:
            parent[root(node)] = root(first)
    return {node: root(node) for node in parent}


def reach_edges(successors, index: dict) -> list:
    """The edges between the nodes `index` renumbers (node -> its number), sorted: one from
    a to b wherever a reaches b directly or through nodes `index` leaves out only
    (`successors[node]`: the nodes it feeds)."""
    contracted = set()
    for node, number in index.items():
        stack, seen = list(successors[node]), set()
        while stack:
            other = stack.pop()
            if other in seen:
                continue
            seen.add(other)
            if other in index:
                contracted.add((number, index[other]))
            else:
                stack.extend(successors[other])
    return sorted(contracted)


def _check_candidate(candidate: Candidate, num_nodes: int) -> None:
    if not candidate.nodes:
        raise CoverError(f"cheapest cover: candidate {candidate.backend}:{candidate.name or 'op'} covers no node")
    outside = [node for node in candidate.nodes
               if not (isinstance(node, numbers.Integral) and 0 <= node < num_nodes)]
    if outside:
        raise CoverError(f"cheapest cover: candidate {candidate.describe()} names nodes {outside}, outside the "
                         f"graph's {num_nodes}")
    if not (isinstance(candidate.cost_us, numbers.Real) and math.isfinite(candidate.cost_us)
            and candidate.cost_us >= 0):
        raise CoverError(f"cheapest cover: candidate {candidate.backend}:{candidate.name or 'op'} has cost "
                         f"{candidate.cost_us!r}; expected a finite number of microseconds >= 0")


class _Search:
    """The memoized search: best(covered mask, frontier, placed) -> (cost of the rest,
    candidate indices placed from here on, or None where no schedulable rest exists), the
    memo keyed on the covered mask, the frontier and the reach between frontier nodes."""

    def __init__(self, num_nodes, successors, predecessors, candidates, holding, boundary_cost, max_states):
        self.num_nodes, self.successors, self.predecessors = num_nodes, successors, predecessors
        self.candidates, self.holding, self.boundary_cost = candidates, holding, boundary_cost
        self.max_states = max_states
        self.memo: dict = {}
        self.full = (1 << num_nodes) - 1
        self.masks = [functools.reduce(operator.or_, (1 << int(node) for node in c.nodes), 0) for c in candidates]
        self.refused_cycles = False  # whether a placement was refused for closing a cycle

    def best(self, covered: int, frontier: tuple, placed: tuple):
        """`frontier`: sorted (node, candidate index) of covered nodes with an uncovered
        neighbour; `placed`: the candidate indices placed so far (the cycle check reads
        them; the memo keys on what of them the rest depends on: see the module docstring)."""
        if covered == self.full:
            return 0.0, ()
        group_of = self._group_of(placed)  # covered node -> its candidate: read by the key and the cycle checks
        key = (covered, frontier, self._reach(covered, frontier, placed, group_of))
        if key in self.memo:
            return self.memo[key]
        if len(self.memo) >= self.max_states:
            raise CoverError(f"cheapest cover: the search passed {self.max_states} states (too many overlapping "
                             f"candidates to search)")
        first = _lowest_unset(covered)
        owner = dict(frontier)
        best_cost, best_choices = math.inf, None
        for index in self.holding[first]:
            mask = self.masks[index]
            if mask & covered:
                continue
            if self._closes_cycle(index, group_of):
                self.refused_cycles = True
                continue
            step = self.candidates[index].cost_us + self._boundaries_with(index, owner)
            new_covered = covered | mask
            rest_cost, rest = self.best(new_covered, self._frontier(new_covered, owner, index), placed + (index,))
            if rest is None:
                continue
            total = step + rest_cost
            if best_choices is None or total < best_cost - TIE_TOLERANCE * max(1.0, abs(best_cost)):
                best_cost, best_choices = total, (index,) + rest
        result = (best_cost, best_choices)
        self.memo[key] = result
        return result

    def decisions(self, choices: tuple) -> list:
        """The Decision of each placement along `choices` (the chosen path from the empty
        state), the alternatives' costs read from the memo (solved already, or solved now)."""
        found, covered, frontier, placed, spent = [], 0, (), (), 0.0
        for index in choices:
            first = _lowest_unset(covered)
            owner, group_of = dict(frontier), self._group_of(placed)
            alternatives = []
            for other in self.holding[first]:
                if other == index or self.masks[other] & covered:
                    continue
                if self._closes_cycle(other, group_of):
                    alternatives.append(Alternative(self.candidates[other], None, "would close a cycle"))
                    continue
                step = self.candidates[other].cost_us + self._boundaries_with(other, owner)
                rest_cost, rest = self.best(covered | self.masks[other], self._frontier(
                    covered | self.masks[other], owner, other), placed + (other,))
                alternatives.append(Alternative(self.candidates[other], spent + step + rest_cost, "",
                                                tuple(self.candidates[i] for i in placed + (other,) + rest))
                                    if rest is not None else
                                    Alternative(self.candidates[other], None, "leaves no schedulable cover"))
            step = self.candidates[index].cost_us + self._boundaries_with(index, owner)
            new_covered = covered | self.masks[index]
            rest_cost, _ = self.best(new_covered, self._frontier(new_covered, owner, index), placed + (index,))
            alternatives.sort(key=lambda a: (a.cost_us is None, a.cost_us or 0.0))
            found.append(Decision(first, self.candidates[index], spent + step + rest_cost, tuple(alternatives)))
            spent += step
            frontier = self._frontier(new_covered, owner, index)
            covered, placed = new_covered, placed + (index,)
        return found

    def _boundaries_with(self, index: int, owner: dict) -> float:
        """The boundary costs between candidate `index` and the covered nodes next to it
        (owner: covered frontier node -> its candidate)."""
        candidate = self.candidates[index]
        total = 0.0
        for node in candidate.nodes:
            for producer in self.predecessors[node]:
                if producer in owner:
                    total += self._charge(self.candidates[owner[producer]], candidate, producer, node)
            for consumer in self.successors[node]:
                if consumer in owner:
                    total += self._charge(candidate, self.candidates[owner[consumer]], node, consumer)
        return total

    def _charge(self, producer_candidate, consumer_candidate, producer, consumer) -> float:
        cost = self.boundary_cost(producer_candidate, consumer_candidate, producer, consumer)
        if not (isinstance(cost, (int, float)) and math.isfinite(cost) and cost >= 0):
            raise CoverError(f"cheapest cover: boundary cost {cost!r} for edge {producer} -> {consumer}; expected "
                             f"a finite number of microseconds >= 0")
        return float(cost)

    def _frontier(self, covered: int, owner: dict, index: int) -> tuple:
        """The covered nodes that still have an uncovered neighbour, with their candidates."""
        merged = dict(owner)
        for node in self.candidates[index].nodes:
            merged[node] = index
        return tuple(sorted((node, candidate) for node, candidate in merged.items()
                            if any(not covered >> n & 1 for n in self.successors[node] | self.predecessors[node])))

    def _group_of(self, placed: tuple) -> dict:
        return {node: group for group in placed for node in self.candidates[group].nodes}

    def _reach(self, covered: int, frontier: tuple, placed: tuple, group_of: dict) -> frozenset:
        """(x, y) for frontier nodes x != y where y is reachable from x through covered nodes
        only, each placed candidate one node (its nodes reach one another)."""
        if len(frontier) < 2:
            return frozenset()
        group_successors: dict = {}
        for group in placed:
            successors = set()
            for node in self.candidates[group].nodes:
                for consumer in self.successors[node]:
                    if covered >> consumer & 1 and group_of[consumer] != group:
                        successors.add(group_of[consumer])
            group_successors[group] = successors
        frontier_nodes = [node for node, _ in frontier]
        pairs = set()
        for x in frontier_nodes:
            start = group_of[x]
            seen, stack = {start}, [start]
            while stack:
                for successor in group_successors[stack.pop()]:
                    if successor not in seen:
                        seen.add(successor)
                        stack.append(successor)
            pairs.update((x, y) for y in frontier_nodes if y != x and group_of[y] in seen)
        return frozenset(pairs)

    def _closes_cycle(self, index: int, group_of: dict) -> bool:
        """Whether placing candidate `index` makes the graph of placed candidates (each one
        node; group_of: covered node -> its candidate) and uncovered nodes (each its own)
        cyclic: a path out of the candidate that comes back into it through other groups or
        nodes."""
        members = self.candidates[index].nodes

        def group_successors(group_nodes):
            for node in group_nodes:
                for consumer in self.successors[node]:
                    yield index if consumer in members else group_of.get(consumer, ("node", consumer))

        def nodes_of(group):
            return (group[1],) if isinstance(group, tuple) else self.candidates[group].nodes

        seen, stack = set(), [g for g in group_successors(members) if g != index]
        while stack:
            group = stack.pop()
            if group == index:
                return True
            if group in seen:
                continue
            seen.add(group)
            stack.extend(group_successors(nodes_of(group)))
        return False


def _lowest_unset(mask: int) -> int:
    inverted = ~mask
    return (inverted & -inverted).bit_length() - 1


def _boundaries(chosen, successors, boundary_cost) -> list:
    """(producer, consumer, cost) of every edge between two chosen candidates."""
    owner = {node: candidate for candidate in chosen for node in candidate.nodes}
    found = []
    for producer, consumers in enumerate(successors):
        for consumer in sorted(consumers):
            if owner[producer] is not owner[consumer]:
                found.append((producer, consumer, float(boundary_cost(owner[producer], owner[consumer],
                                                                      producer, consumer))))
    return found


def _has_cycle(chosen, num_nodes, successors) -> bool:
    """Whether the graph with each chosen candidate as one node has a cycle."""
    group = {node: index for index, candidate in enumerate(chosen) for node in candidate.nodes}
    edges = [set() for _ in chosen]
    for producer in range(num_nodes):
        for consumer in successors[producer]:
            if group[producer] != group[consumer]:
                edges[group[producer]].add(group[consumer])
    state = [0] * len(chosen)  # 0 unvisited, 1 on the stack, 2 done
    for start in range(len(chosen)):
        if state[start]:
            continue
        stack = [(start, iter(edges[start]))]
        state[start] = 1
        while stack:
            node, successors_left = stack[-1]
            advanced = False
            for successor in successors_left:
                if state[successor] == 1:
                    return True
                if state[successor] == 0:
                    state[successor] = 1
                    stack.append((successor, iter(edges[successor])))
                    advanced = True
                    break
            if not advanced:
                state[node] = 2
                stack.pop()
    return False
