"""FuseOpsByPattern: wrap pattern matches of main into composite functions.

For each backend in priority order, and each of its pattern-table entries in order (a
table lists its larger patterns first), main's bindings are tried as match roots from
the last to the first, so a match takes as much of the graph as its pattern allows. An
accepted match becomes a local function written inline where its root was bound:

    %matmul_bias = fn (%p0: T, %p1: T, %p2: T) -> T [Composite="cutlass.dense_bias", Primitive=1] {
      %0 = matmul(%p0, %p1)
      %1 = add(%0, %p2)
      return %1
    }
    %y = %matmul_bias(%x, meta[0], meta[1])

Every leaf of the match (wildcards, constants) is a parameter, in first-use order, except
scalar constants (one element), which stay in the body: they are part of what the
function computes (a backend folds a scale into its epilogue) and, like the built-in
backend's scalars, they are never lifted into parameters by the outliner either. A match
is refused, with the reason kept for the partition report, when a node in it is already
claimed, when an intermediate is used outside the match (fusing would duplicate work or
lose a value), when a node of it reaches one of its own inputs through an outside node (a
cycle: checked first, since no amount of duplication could fuse it), or when the
pattern's check says no. A refused match gives way to the pattern's next match at the same
root, if any (MobileNetV2's `x + conv(x)` where x is itself a conv's output: the residual
pattern's first argument order takes x's conv, whose output reaches the other operand, a
cycle; the other order fuses the block's own conv). Leaves alone: everything no pattern
takes, and functions other than main.
"""
from __future__ import annotations

from ..ir.expr import Binding, Call, Constant, Function, Var
from ..ir.module import IRModule
from ..pattern import matches as match_patterns

# A root's matches tried before its refusal stands (each refused one costs a cycle check).
MATCHES_PER_ROOT = 16


def _uses(func: Function) -> dict:
    uses: dict = {}
    for index, binding in enumerate(func.bindings):
        for var in _vars_in(binding.value):
            uses.setdefault(var, []).append(index)
    for var in _vars_in(func.result):
        uses.setdefault(var, []).append(len(func.bindings))
    return uses


def _vars_in(expr) -> list:
    from ..ir.expr import Tuple, TupleGetItem
    if isinstance(expr, Var):
        return [expr]
    if isinstance(expr, Call):
        found = [v for a in expr.args for v in _vars_in(a)]
        if isinstance(expr.op, Var):
            found.append(expr.op)
        return found
    if isinstance(expr, Tuple):
        return [v for f in expr.fields for v in _vars_in(f)]
    if isinstance(expr, TupleGetItem):
        return _vars_in(expr.tuple_value)
    return []


def _reaches(start_vars, targets, bindings, position_of, binding_inputs) -> bool:
    """Whether any target is computed (transitively) from any of start_vars
    (`binding_inputs`: the vars each binding reads, by position)."""
    tainted = set(start_vars)
    first = min(position_of[v] for v in start_vars)
    last = max((position_of.get(t, -1) for t in targets), default=-1)
    for index in range(first, last + 1):
        var = bindings[index].var
        if var not in tainted and any(v in tainted for v in binding_inputs[index]):
            tainted.add(var)
    return any(t in tainted for t in targets)


def fuse_ops_by_pattern(mod: IRModule, backend_names: list, report=None) -> IRModule:
    from ..backend import get_backend
    mod = mod.copy()
    main = mod["main"]
    bindings = list(main.bindings)
    for backend_name in backend_names:
        backend = get_backend(backend_name)
        for entry in backend.patterns:
            bindings = _fuse_entry(bindings, main, backend, entry, report)
    mod["main"] = Function(main.params, bindings, main.result, main.ret_type, main.attrs)
    return mod


def _fuse_entry(bindings, main, backend, entry, report):
    composite = f"{backend.name}.{entry.name}"
    accepted = []  # (root var, match)
    claimed = set()
    matcher = _Matcher(bindings, main)
    for binding in reversed(bindings):
        root = binding.var
        if root in claimed or root not in matcher.producers:
            continue
        # the first of the pattern's matches here that is not refused (add(x, y) matched in
        # the other argument order where the first would make a cycle); a refusal reported
        # is the first match's
        found, first_reason = None, None
        for candidate in matcher.matches(entry, root):
            reason = "overlaps a match already taken" if set(candidate.matched) & claimed else \
                matcher.refusal(entry, root, candidate)
            if reason is None:
                found = candidate
                break
            first_reason = first_reason or reason
        if found is None:
            if first_reason is not None and report is not None:
                report.refuse(backend.name, entry.name, matcher.producers[root].op.name, first_reason,
                              node=root.name_hint)
            continue
        claimed |= set(found.matched)
        accepted.append((root, found))
    if report is not None:
        for root, found in accepted:
            report.accept(backend.name, entry.name, [bindings[_position(bindings, v)].value.op.name
                                                   for v in found.matched])
    return _wrap_matches(bindings, [(root, found, composite) for root, found in accepted])


def _wrap_matches(bindings, accepted):
    """`bindings` with each accepted (root, match, composite name), matches that do not
    overlap, made a composite function written where its root was bound."""
    if not accepted:
        return bindings
    replacement = {root: _composite_bindings(root, found, bindings, composite) for root, found, composite in accepted}
    removed = set().union(*(set(found.matched) for _, found, _ in accepted))
    result = []
    for binding in bindings:
        if binding.var in replacement:
            result.extend(replacement[binding.var])
        elif binding.var not in removed:
            result.append(binding)
    return result


class _Matcher:
    """An entry's matches in one list of bindings: matches(entry, root) yields the pattern's
    matches rooted at `root`, first to last (their leaves that are matched nodes dropped),
    refusal(entry, root, found) the reason a match cannot be a function (a cycle, an
    intermediate used outside it, the entry's check), or None."""

    def __init__(self, bindings, main):
        self.bindings = bindings
        func = Function(main.params, bindings, main.result, main.ret_type, main.attrs)
        self.uses = _uses(func)
        self.position_of = {b.var: i for i, b in enumerate(bindings)}
        # the vars each binding reads, once: every candidate match's cycle check walks them
        self.binding_inputs = [_vars_in(b.value) for b in bindings]
        self.producers = {b.var: b.value for b in bindings
                          if isinstance(b.value, Call) and not isinstance(b.value.op, (Var, Function))}

    def matches(self, entry, root):
        for found in match_patterns(entry.pattern, root, self.producers, limit=MATCHES_PER_ROOT):
            if not found.matched:
                continue
            matched = set(found.matched)
            found.inputs = [i for i in found.inputs if not (isinstance(i, Var) and i in matched)]
            yield found

    def refusal(self, entry, root, found):
        matched = set(found.matched)
        # Checked before outside uses: a cycle can never be fused, whatever is duplicated.
        input_vars = [i for i in found.inputs if isinstance(i, Var) and i in self.position_of]
        if input_vars and _reaches(matched, input_vars, self.bindings, self.position_of, self.binding_inputs):
            return "its output reaches one of its own inputs through an outside node (a cycle)"
        for var in found.matched:
            if var is root:
                continue
            outside = [u for u in self.uses.get(var, [])
                       if u == len(self.bindings) or self.bindings[u].var not in matched]
            if outside:
                return f"intermediate %{var.name_hint} is also used outside the match (fusing would duplicate it)"
        return entry.check(found) if entry.check is not None else None


def _position(bindings, var):
    for i, b in enumerate(bindings):
        if b.var is var:
            return i
    raise KeyError(var)


def _composite_bindings(root, found, bindings, composite):
    params, substitution, arguments = [], {}, []
    for leaf in found.inputs:
        if isinstance(leaf, Constant) and leaf.type.size == 1:
            continue  # a scalar stays in the body (see the module docstring)
        param = Var(f"p{len(params)}", leaf.type)
        params.append(param)
        arguments.append(leaf)
        substitution[leaf] = param
    matched = set(found.matched)
    body = []
    for binding in bindings:
        if binding.var in matched:
            call = binding.value
            args = [substitution.get(a, a) if isinstance(a, (Var, Constant)) else a for a in call.args]
            new_var = Var(binding.var.name_hint, binding.var.type)
            substitution[binding.var] = new_var
            body.append(Binding(new_var, Call(call.op, args, call.attrs, type_=call.type)))
    function = Function(params, body, substitution[root], root.type,
                        {"Composite": composite, "Primitive": 1})
    function_var = Var(composite.replace(".", "_"), function.type)
    return [Binding(function_var, function),
            Binding(root, Call(function_var, arguments, type_=root.type))]
