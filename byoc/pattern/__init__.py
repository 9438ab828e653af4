"""A dataflow pattern language over A-normal-form functions.

    dense = is_op("matmul")(wildcard().named("a"), wildcard().named("b")).named("matmul")
    dense_bias = dense.optional(lambda x: is_op("add")(x, wildcard().has_rank(1).named("bias")))
    gelu = is_op("gelu")(dense_bias) | is_op("relu")(dense_bias)

Patterns: `is_op(name)(*args)` (a call of that op whose arguments match), `wildcard()`
(anything: it becomes an input of the match), `is_const()` (a Constant input),
`p1 | p2` (the first that matches), `p.optional(f)` (f(p) if it matches, else p),
`.named(n)` (remember the matched expression under n; a name met twice must be the same
expression both times), and predicates `.has_dtype`,
`.has_rank`, `.has_shape`, `.has_attr`, `.where(fn)`.

`match(pattern, var, producers)` follows Vars to the op calls bound to them
(`producers`: Var -> Call) and returns a Match or None; `matches(...)` yields every match,
first to last (a caller that refuses one takes the next).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..ir.expr import Call, Constant, Expr, Var
from ..ir.op import Op


class Pattern:
    def __or__(self, other: "Pattern") -> "Pattern":
        return AltPattern(self, other)

    def named(self, name: str) -> "Pattern":
        return NamedPattern(self, name)

    def optional(self, extend: Callable[["Pattern"], "Pattern"]) -> "Pattern":
        """`extend(self)` when it matches (longest first), else `self`."""
        return AltPattern(extend(self), self)

    def where(self, predicate: Callable[[Expr], bool]) -> "Pattern":
        return PredicatePattern(self, predicate)

    def has_dtype(self, *dtypes: str) -> "Pattern":
        return self.where(lambda e: getattr(e.type, "dtype", None) in dtypes)

    def has_rank(self, *ranks: int) -> "Pattern":
        return self.where(lambda e: len(getattr(e.type, "shape", ())) in ranks)

    def has_shape(self, shape) -> "Pattern":
        """The exact shape; a None dimension matches any size: `has_shape((None, 64))`."""
        wanted = tuple(shape)

        def same_shape(expr) -> bool:
            actual = tuple(getattr(expr.type, "shape", ()))
            return len(actual) == len(wanted) and all(w is None or w == a for w, a in zip(wanted, actual))
        return self.where(same_shape)

    def has_attr(self, attrs: dict) -> "Pattern":
        return AttrPattern(self, dict(attrs))


@dataclass(eq=False)
class WildcardPattern(Pattern):
    pass


@dataclass(eq=False)
class ConstantPattern(Pattern):
    pass


@dataclass(eq=False)
class CallPattern(Pattern):
    op_name: str
    args: tuple


@dataclass(eq=False)
class AltPattern(Pattern):
    left: Pattern
    right: Pattern


@dataclass(eq=False)
class NamedPattern(Pattern):
    inner: Pattern
    name: str


@dataclass(eq=False)
class PredicatePattern(Pattern):
    inner: Pattern
    predicate: Callable


@dataclass(eq=False)
class AttrPattern(Pattern):
    inner: Pattern
    attrs: dict


class _OpPatternMaker:
    def __init__(self, op_name: str):
        self.op_name = op_name

    def __call__(self, *args: Pattern) -> CallPattern:
        return CallPattern(self.op_name, tuple(args))


def is_op(op_name: str) -> _OpPatternMaker:
    return _OpPatternMaker(op_name)


def wildcard() -> WildcardPattern:
    return WildcardPattern()


def is_const() -> ConstantPattern:
    return ConstantPattern()


def ops_named(pattern: Pattern) -> set[str]:
    """Every op name a pattern mentions (registration checks they exist)."""
    if isinstance(pattern, CallPattern):
        return {pattern.op_name}.union(*(ops_named(a) for a in pattern.args)) if pattern.args else {pattern.op_name}
    if isinstance(pattern, AltPattern):
        return ops_named(pattern.left) | ops_named(pattern.right)
    if isinstance(pattern, (NamedPattern, PredicatePattern, AttrPattern)):
        return ops_named(pattern.inner)
    return set()


@dataclass
class Match:
    """A match rooted at `output`: the Vars whose bindings it covers (in definition order
    once sorted by the caller), its inputs (outside expressions, first-use order) and the
    named sub-expressions."""
    output: Var
    matched: list = field(default_factory=list)  # Vars bound to matched calls
    inputs: list = field(default_factory=list)  # outside Vars and Constants
    named: dict = field(default_factory=dict)
    producers: dict = field(default_factory=dict, repr=False)  # Var -> Call, for checks

    def __getitem__(self, name):
        return self.named[name]

    @property
    def bindings(self) -> list:
        """The matched `(var, call)` pairs, root first, then its producers depth first."""
        return [(var, self.producers[var]) for var in self.matched]

    def call_of(self, name: str) -> Call:
        """The op call bound to the named node (to read its attributes)."""
        return self.producers[self.named[name]]


def match(pattern: Pattern, expr: Expr, producers: dict) -> Match | None:
    """The first match (see `matches`), or None."""
    return next(matches(pattern, expr, producers), None)


def matches(pattern: Pattern, expr: Expr, producers: dict, limit: int = 64):
    """Every way `pattern` matches at `expr`, first to last, at most `limit`: `p1 | p2`
    tries p1's matches before p2's, and a call's arguments are matched left to right, each
    argument's later matches tried when a later argument fails. The first is what a greedy
    matcher finds where it finds one; the others let a caller refuse a match and take the
    next (add(x, y) in either argument order, where one order would make a cycle)."""
    state = Match(output=expr, producers=producers)
    for count, _ in enumerate(_matches(pattern, expr, producers, state)):
        if count >= limit:
            return
        yield Match(output=expr, matched=list(state.matched), inputs=list(state.inputs), named=dict(state.named),
                    producers=producers)


def _snapshot(state: Match):
    return len(state.matched), len(state.inputs), dict(state.named)


def _restore(state: Match, snapshot):
    matched, inputs, named = snapshot
    del state.matched[matched:]
    del state.inputs[inputs:]
    state.named = named


def _matches(pattern: Pattern, expr: Expr, producers: dict, state: Match):
    """Yields once for each way `pattern` matches `expr`, with `state` holding that match
    while suspended; restores `state` before trying the next way and when done."""
    if isinstance(pattern, (WildcardPattern, ConstantPattern)):
        if isinstance(pattern, ConstantPattern) and not isinstance(expr, Constant):
            return
        snapshot = _snapshot(state)
        if not any(expr is seen for seen in state.inputs):
            state.inputs.append(expr)
        yield
        _restore(state, snapshot)
        return
    if isinstance(pattern, NamedPattern):
        # a name used twice in one pattern is one value: x * 0.5 * (1 + erf(x / sqrt(2)))
        # is GELU only where both x are the same expression
        bound = state.named.get(pattern.name)
        if bound is not None and bound is not expr:
            return
        for _ in _matches(pattern.inner, expr, producers, state):
            before = state.named.get(pattern.name)
            state.named[pattern.name] = expr
            yield
            if before is None:
                state.named.pop(pattern.name, None)
            else:
                state.named[pattern.name] = before
        return
    if isinstance(pattern, PredicatePattern):
        for _ in _matches(pattern.inner, expr, producers, state):
            if pattern.predicate(expr):
                yield
        return
    if isinstance(pattern, AttrPattern):
        call = producers.get(expr) if isinstance(expr, Var) else None
        if call is None or not all(call.attrs.get(k) == v for k, v in pattern.attrs.items()):
            return
        yield from _matches(pattern.inner, expr, producers, state)
        return
    if isinstance(pattern, AltPattern):
        yield from _matches(pattern.left, expr, producers, state)
        yield from _matches(pattern.right, expr, producers, state)
        return
    if isinstance(pattern, CallPattern):
        if not isinstance(expr, Var) or expr not in producers:
            return
        call = producers[expr]
        if not (isinstance(call.op, Op) and call.op.name == pattern.op_name) or len(call.args) != len(pattern.args):
            return
        if any(expr is seen for seen in state.matched):
            yield  # the same node reached twice (a diamond inside the pattern)
            return
        snapshot = _snapshot(state)
        state.matched.append(expr)
        yield from _argument_matches(pattern.args, call.args, 0, producers, state)
        _restore(state, snapshot)
        return
    raise TypeError(f"not a pattern: {pattern!r}")


def _argument_matches(patterns, args, index, producers, state):
    if index == len(patterns):
        yield
        return
    for _ in _matches(patterns[index], args[index], producers, state):
        yield from _argument_matches(patterns, args, index + 1, producers, state)
