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
(`producers`: Var -> Call) and returns a Match or None.
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
    state = Match(output=expr, producers=producers)
    if _match(pattern, expr, producers, state):
        return state
    return None


def _snapshot(state: Match):
    return len(state.matched), len(state.inputs), dict(state.named)


def _restore(state: Match, snapshot):
    matched, inputs, named = snapshot
    del state.matched[matched:]
    del state.inputs[inputs:]
    state.named = named


def _match(pattern: Pattern, expr: Expr, producers: dict, state: Match) -> bool:
    if isinstance(pattern, WildcardPattern):
        if not any(expr is seen for seen in state.inputs):
            state.inputs.append(expr)
        return True
    if isinstance(pattern, ConstantPattern):
        if isinstance(expr, Constant):
            if not any(expr is seen for seen in state.inputs):
                state.inputs.append(expr)
            return True
        return False
    if isinstance(pattern, NamedPattern):
        # a name used twice in one pattern is one value: x * 0.5 * (1 + erf(x / sqrt(2)))
        # is GELU only where both x are the same expression
        bound = state.named.get(pattern.name)
        if bound is not None and bound is not expr:
            return False
        if _match(pattern.inner, expr, producers, state):
            state.named[pattern.name] = expr
            return True
        return False
    if isinstance(pattern, PredicatePattern):
        snapshot = _snapshot(state)
        if _match(pattern.inner, expr, producers, state) and pattern.predicate(expr):
            return True
        _restore(state, snapshot)
        return False
    if isinstance(pattern, AttrPattern):
        snapshot = _snapshot(state)
        call = producers.get(expr) if isinstance(expr, Var) else None
        if call is not None and all(call.attrs.get(k) == v for k, v in pattern.attrs.items()) and \
                _match(pattern.inner, expr, producers, state):
            return True
        _restore(state, snapshot)
        return False
    if isinstance(pattern, AltPattern):
        snapshot = _snapshot(state)
        if _match(pattern.left, expr, producers, state):
            return True
        _restore(state, snapshot)
        return _match(pattern.right, expr, producers, state)
    if isinstance(pattern, CallPattern):
        if not isinstance(expr, Var) or expr not in producers:
            return False
        call = producers[expr]
        if not (isinstance(call.op, Op) and call.op.name == pattern.op_name) or len(call.args) != len(pattern.args):
            return False
        if any(expr is seen for seen in state.matched):
            return True  # the same node reached twice (a diamond inside the pattern)
        snapshot = _snapshot(state)
        state.matched.append(expr)
        for arg_pattern, arg in zip(pattern.args, call.args):
            if not _match(arg_pattern, arg, producers, state):
                _restore(state, snapshot)
                return False
        return True
    raise TypeError(f"not a pattern: {pattern!r}")
