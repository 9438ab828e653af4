"""cheapest_cover (byoc/transform/cheapest_cover.py): the choice among backends' candidates
by cost, on hand-built cost tables: overlapping candidates, boundary costs, ties, cycles
between candidates, errors; and against a brute force over random graphs."""
import random

import pytest

from byoc.transform.cheapest_cover import Candidate, CoverError, cheapest_cover


def chosen(cover):
    return sorted((c.backend, tuple(sorted(c.nodes))) for c in cover.candidates)


def op(backend, node, cost):
    return Candidate(backend, frozenset([node]), cost, "op")


def test_overlapping_candidates_the_cheaper_combination_wins():
    """0 -> 1 -> 2 (matmul, bias, gelu): CUTLASS fuses 0-1, cuBLASLt 1-2; every op alone on
    the built-in backend. {0} + {1, 2} (10 + 5) beats {0, 1} + {2} (12 + 10) and the singles."""
    candidates = [Candidate("cutlass", frozenset({0, 1}), 12.0, "dense_bias"),
                  Candidate("cublaslt", frozenset({1, 2}), 5.0, "bias_gelu"),
                  op("builtin", 0, 10.0), op("builtin", 1, 10.0), op("builtin", 2, 10.0)]
    cover = cheapest_cover(3, [(0, 1), (1, 2)], candidates)
    assert chosen(cover) == [("builtin", (0,)), ("cublaslt", (1, 2))]
    assert cover.cost_us == pytest.approx(15.0)
    assert cover.boundaries == [(0, 1, 0.0)]
    assert cover.candidate_of()[2].backend == "cublaslt"
    # what the report shows: at each placement, the other candidates and the whole cover's
    # cost with each of them there
    assert [d.describe() for d in cover.decisions] == [
        "node 0: builtin:op (whole cover 15 us) over cutlass:dense_bias 22 us",
        "node 1: cublaslt:bias_gelu (whole cover 15 us) over builtin:op 30 us"]


def test_boundary_costs_change_the_choice():
    """The same table with a cost of 8 us on every edge between two backends (a layout
    change): {0} builtin + {1, 2} cublaslt now costs 23, {0, 1} cutlass + {2} cutlass (a
    CUTLASS op alone, 4 us) 16 plus a same-backend boundary of 1."""
    candidates = [Candidate("cutlass", frozenset({0, 1}), 12.0, "dense_bias"),
                  Candidate("cublaslt", frozenset({1, 2}), 5.0, "bias_gelu"),
                  op("builtin", 0, 10.0), op("builtin", 1, 10.0), op("builtin", 2, 10.0),
                  op("cutlass", 2, 4.0)]

    def boundary(producer, consumer, *_):
        return 8.0 if producer.backend != consumer.backend else 1.0

    cover = cheapest_cover(3, [(0, 1), (1, 2)], candidates, boundary)
    assert chosen(cover) == [("cutlass", (0, 1)), ("cutlass", (2,))]
    assert cover.cost_us == pytest.approx(17.0)
    assert cover.boundaries == [(1, 2, 1.0)]
    without = cheapest_cover(3, [(0, 1), (1, 2)], candidates)
    assert chosen(without) == [("builtin", (0,)), ("cublaslt", (1, 2))]


@pytest.mark.parametrize("order", ["cutlass_first", "cublaslt_first"])
def test_a_tie_goes_to_the_candidate_listed_first(order):
    """Two backends offer the same match at the same cost: the one listed first (the
    config's priority order) is chosen, whichever it is."""
    a = Candidate("cutlass", frozenset({0, 1}), 7.0, "dense_bias")
    b = Candidate("cublaslt", frozenset({0, 1}), 7.0, "dense_bias")
    singles = [op("builtin", 0, 5.0), op("builtin", 1, 5.0)]
    candidates = [a, b] + singles if order == "cutlass_first" else [b, a] + singles
    cover = cheapest_cover(2, [(0, 1)], candidates)
    assert [c.backend for c in cover.candidates] == [order.split("_")[0]]


def test_a_diamond_with_a_candidate_of_nodes_apart():
    """0 -> {1, 2} -> 3: a candidate may hold nodes that are not neighbours in the order
    ({0, 2}: its first node is placed, then 1 alone, then 3)."""
    edges = [(0, 1), (0, 2), (1, 3), (2, 3)]
    candidates = [Candidate("cutlass", frozenset({0, 2}), 3.0, "conv_relu"),
                  Candidate("cutlass", frozenset({1, 3}), 3.0, "conv_add")] + \
        [op("builtin", n, 4.0) for n in range(4)]
    cover = cheapest_cover(4, edges, candidates)
    assert chosen(cover) == [("cutlass", (0, 2)), ("cutlass", (1, 3))]
    assert cover.cost_us == pytest.approx(6.0)


def test_candidates_that_would_need_each_other_are_not_both_chosen():
    """a=0 -> b=1 and c=2 -> d=3: {a, d} and {b, c} are each convex, but together {a, d}
    feeds {b, c} (a -> b) and {b, c} feeds {a, d} (c -> d): no order runs them. The pair
    (2 us) is refused; the cheapest schedulable cover takes one of them and two singles."""
    edges = [(0, 1), (2, 3)]
    candidates = [Candidate("x", frozenset({0, 3}), 1.0, "ad"), Candidate("x", frozenset({1, 2}), 1.0, "bc")] + \
        [op("builtin", n, 5.0) for n in range(4)]
    cover = cheapest_cover(4, edges, candidates)
    assert cover.cost_us == pytest.approx(11.0)
    assert chosen(cover) == [("builtin", (1,)), ("builtin", (2,)), ("x", (0, 3))]
    # at node 1, {b, c} was weighed and refused: with {a, d} placed it closes the cycle
    (at_b,) = [d for d in cover.decisions if d.node == 1]
    assert [(a.candidate.name, a.cost_us, a.why_not) for a in at_b.alternatives] == [("bc", None, "would close a cycle")]


def test_no_schedulable_cover_is_an_error():
    edges = [(0, 1), (2, 3)]
    candidates = [Candidate("x", frozenset({0, 3}), 1.0, "ad"), Candidate("x", frozenset({1, 2}), 1.0, "bc")]
    with pytest.raises(CoverError, match="can be scheduled .*need each other"):
        cheapest_cover(4, edges, candidates)


def test_candidates_that_only_overlap_are_an_error_that_says_so():
    candidates = [Candidate("x", frozenset({0, 1}), 1.0, "ab"), Candidate("x", frozenset({1, 2}), 1.0, "bc")]
    with pytest.raises(CoverError, match="covers every node exactly once \\(they overlap\\)"):
        cheapest_cover(3, [(0, 1), (1, 2)], candidates)


@pytest.mark.parametrize("a_first", [True, False])
def test_two_paths_to_one_state_that_differ_in_what_a_later_candidate_would_close(a_first):
    """Covered nodes {0, 1, 2, 3, 5, 6} with the same frontier's candidates, reached as
    {0, 6} + {1} (A) or {0} + {1, 6} (B), then {2, 5} + {3}: after A, {4, 7} closes a
    cycle (4 -> 5 -> 6, the group {0, 6}, 0 -> 3 -> 7); after B it does not. The memo keys
    on the reach between frontier nodes, so each path gets its own answer: the cheapest
    cover (5.5: B and {4, 7}) whichever path is listed first (a search keyed on the
    frontier alone returned 14 one way and raised the other)."""
    edges = [(0, 3), (3, 7), (4, 5), (5, 6)]
    path_a = [Candidate("a", frozenset({0, 6}), 1.0, "06"), Candidate("a", frozenset({1}), 1.0, "1")]
    path_b = [Candidate("b", frozenset({0}), 1.0, "0"), Candidate("b", frozenset({1, 6}), 1.5, "16")]
    rest = [Candidate("c", frozenset({2, 5}), 1.0, "25"), Candidate("c", frozenset({3}), 1.0, "3"),
            Candidate("c", frozenset({4, 7}), 1.0, "47"), Candidate("c", frozenset({4}), 5.0, "4"),
            Candidate("c", frozenset({7}), 5.0, "7")]
    candidates = (path_a + path_b if a_first else path_b + path_a) + rest
    cover = cheapest_cover(8, edges, candidates)
    assert cover.cost_us == pytest.approx(5.5)
    assert sorted(c.name for c in cover.candidates) == ["0", "16", "25", "3", "47"]


@pytest.mark.parametrize("candidates, edges, message", [
    ([op("builtin", 0, 1.0)], [(0, 1)], "no candidate covers node 1"),
    ([op("builtin", 0, 1.0), op("builtin", 1, -2.0)], [(0, 1)], "has cost -2.0; expected a finite number"),
    ([op("builtin", 0, 1.0), op("builtin", 1, float("nan"))], [(0, 1)], "has cost nan"),
    ([op("builtin", 0, 1.0), op("builtin", 1, 1.0), op("builtin", 5, 1.0)], [(0, 1)], r"names nodes \[5\]"),
    ([Candidate("builtin", frozenset(), 1.0, "empty")], [], "covers no node"),
    ([op("builtin", 0, 1.0), op("builtin", 1, 1.0)], [(0, 7)], "edge 0 -> 7 is not between"),
])
def test_bad_tables_name_what_is_wrong(candidates, edges, message):
    with pytest.raises(CoverError, match=message):
        cheapest_cover(2, edges, candidates)


def test_a_bad_boundary_cost_names_the_edge():
    candidates = [op("a", 0, 1.0), op("b", 1, 1.0)]
    with pytest.raises(CoverError, match=r"boundary cost -1 for edge 0 -> 1"):
        cheapest_cover(2, [(0, 1)], candidates, lambda *_: -1)


def test_a_search_past_its_state_limit_says_so():
    """A long chain where every pair fuses: the search is cut off at max_states (the caller
    then partitions by priority order)."""
    n = 40
    candidates = [op("builtin", i, 2.0) for i in range(n)] + \
        [Candidate("fused", frozenset({i, i + 1}), 3.0, "pair") for i in range(n - 1)]
    edges = [(i, i + 1) for i in range(n - 1)]
    with pytest.raises(CoverError, match="passed 5 states"):
        cheapest_cover(n, edges, candidates, max_states=5)
    cover = cheapest_cover(n, edges, candidates)  # linear in the chain: a state a node
    assert cover.cost_us == pytest.approx(3.0 * n / 2)


def _brute_force(num_nodes, edges, candidates, boundary):
    """The cheapest schedulable exact cover, by trying every one (each set of candidates
    once: the first uncovered node's candidates at each step), without memo or pruning."""
    best = [None]

    def extend(taken, covered):
        if len(covered) == num_nodes:
            owner = {n: i for i, c in enumerate(taken) for n in c.nodes}
            group_edges = {(owner[p], owner[c]) for p, c in edges if owner[p] != owner[c]}
            if not _cyclic(len(taken), group_edges):
                cost = sum(c.cost_us for c in taken) + sum(
                    boundary(taken[owner[p]], taken[owner[c]], p, c) for p, c in edges if owner[p] != owner[c])
                best[0] = cost if best[0] is None else min(best[0], cost)
            return
        first = min(set(range(num_nodes)) - covered)
        for candidate in candidates:
            if first in candidate.nodes and not candidate.nodes & covered:
                extend(taken + [candidate], covered | candidate.nodes)

    extend([], set())
    return best[0]


def _cyclic(count, edges):
    indegree = [0] * count
    for _, consumer in edges:
        indegree[consumer] += 1
    ready = [n for n in range(count) if indegree[n] == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for producer, consumer in edges:
            if producer == node:
                indegree[consumer] -= 1
                if indegree[consumer] == 0:
                    ready.append(consumer)
    return seen != count


@pytest.mark.parametrize("seed", range(40))
def test_the_search_finds_what_a_brute_force_finds(seed):
    """Random DAGs of 7 nodes, every op alone on two backends, random fused candidates of
    2-3 nodes (overlapping), boundary costs by backend pair: the search's cost is the
    brute force's minimum over every schedulable cover."""
    rng = random.Random(seed)
    n = 7
    edges = sorted({(p, c) for c in range(1, n) for p in rng.sample(range(c), rng.randint(1, min(2, c)))})
    candidates = []
    for node in range(n):
        candidates.append(op("builtin", node, rng.uniform(2, 10)))
        candidates.append(op("cutlass", node, rng.uniform(2, 10)))
    for _ in range(8):
        size = rng.randint(2, 3)
        nodes = frozenset(rng.sample(range(n), size))
        candidates.append(Candidate(rng.choice(["cutlass", "cublaslt"]), nodes, rng.uniform(1, 12), "fused"))
    pair_cost = {(a, b): rng.uniform(0, 4) for a in ("builtin", "cutlass", "cublaslt")
                 for b in ("builtin", "cutlass", "cublaslt")}

    def boundary(producer, consumer, *_):
        return pair_cost[producer.backend, consumer.backend]

    cover = cheapest_cover(n, edges, candidates, boundary)
    assert cover.cost_us == pytest.approx(_brute_force(n, edges, candidates, boundary))
    assert cover.cost_us == pytest.approx(sum(c.cost_us for c in cover.candidates)
                                          + sum(cost for _, _, cost in cover.boundaries))
    assert sorted(node for c in cover.candidates for node in c.nodes) == list(range(n))
    # every placement's alternatives cost at least the chosen cover
    for decision in cover.decisions:
        assert decision.cost_us == pytest.approx(cover.cost_us)
        assert all(a.cost_us is None or a.cost_us >= cover.cost_us - 1e-6 for a in decision.alternatives)


@pytest.mark.parametrize("seed", range(40))
def test_without_boundary_costs_the_parts_no_candidate_joins_are_chosen_apart(seed):
    """Random DAGs of 9 nodes whose fused candidates join only nearby nodes (several parts,
    cycles through parts possible): the cover chosen part by part costs what the brute
    force and the whole-graph search find, covers every node once, and every decision's
    cost is the whole cover's."""
    rng = random.Random(seed)
    n = 9
    edges = sorted({(p, c) for c in range(1, n) for p in rng.sample(range(c), rng.randint(1, min(2, c)))})
    candidates = [op(backend, node, rng.uniform(2, 10)) for node in range(n) for backend in ("builtin", "cutlass")]
    for _ in range(5):
        start = rng.randrange(n - 1)
        nodes = frozenset(range(start, min(n, start + rng.randint(2, 3))))
        candidates.append(Candidate("cutlass", nodes, rng.uniform(1, 12), "fused"))
    cover = cheapest_cover(n, edges, candidates)
    whole = cheapest_cover(n, edges, candidates, lambda *_: 0.0)  # a boundary cost: one search of all
    assert cover.cost_us == pytest.approx(whole.cost_us)
    assert cover.cost_us == pytest.approx(_brute_force(n, edges, candidates, lambda *_: 0.0))
    assert sorted(node for c in cover.candidates for node in c.nodes) == list(range(n))
    assert [d.node for d in cover.decisions] == sorted(min(c.nodes) for c in cover.candidates)
    for decision in cover.decisions:
        assert decision.cost_us == pytest.approx(cover.cost_us)
        assert all(a.cost_us is None or a.cost_us >= cover.cost_us - 1e-6 for a in decision.alternatives)


def test_ops_whose_results_are_read_much_later_are_chosen_one_by_one():
    """Twenty ops, each on two backends, whose results only the last op reads (as a skip
    connection's or a concatenation's inputs are): searched whole, each finished op's choice
    stays in the state until the last op is placed (2**20 states); op by op, the search is
    small, and chooses the cheaper backend of each."""
    n = 20
    candidates = [op("builtin", node, 2.0 + node % 3) for node in range(n)] + \
        [op("cutlass", node, 1.0 + node % 2 * 3) for node in range(n)] + [op("builtin", n, 1.0)]
    edges = [(node, n) for node in range(n)]
    with pytest.raises(CoverError, match="passed 2000 states"):
        cheapest_cover(n + 1, edges, candidates, lambda *_: 0.0, max_states=2000)
    cover = cheapest_cover(n + 1, edges, candidates, max_states=2000)
    assert cover.cost_us == pytest.approx(1.0 + sum(min(2.0 + node % 3, 1.0 + node % 2 * 3) for node in range(n)))


def test_an_alternative_that_would_need_another_part_in_a_cycle_has_no_cost_in_the_report():
    """Searched part by part, X = {0, 2} is weighed in its own part, where 0 reaches 2
    through node 1 of another part: the chosen cover is the singles, and X is reported as
    closing a cycle through that part, not with the cost of a cover that cannot run."""
    candidates = [Candidate("a", frozenset([0]), 1.0, "s0"), Candidate("a", frozenset([1]), 1.0, "s1"),
                  Candidate("a", frozenset([2]), 1.0, "s2"), Candidate("b", frozenset([0, 2]), 5.0, "X")]
    cover = cheapest_cover(3, [(0, 1), (1, 2)], candidates)
    assert [c.name for c in cover.candidates] == ["s0", "s1", "s2"] and cover.cost_us == 3.0
    (x,) = cover.decisions[0].alternatives
    assert x.candidate.name == "X" and x.cost_us is None and x.why_not == "would close a cycle through another part"
