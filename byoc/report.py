"""The partition report: per backend, the partitions (the call sites of its outlined
functions), the unique functions, the composites matched and ops covered, and every
refused match with the reason. `to_json()` is written next to the build; `to_text()` is
the readable table:

    backend      partitions  unique  composites  refused  ops covered
    ----------------------------------------------------------------------------
    cutlass              96       4          96       12  add x96, gelu x12, matmul x96

    calls per run: 121, of which 13 only move data (transpose x12, layout x1)

    refused matches:
      cutlass.dense_bias x12: K=770 not a multiple of 8

The calls per run count every call of a backend function in main but the reshapes, which
run as views; the ones that only move data are the built-in backend's copies (transposes,
slices, concats, pads, broadcasts, strided layout chains), which a better partition or a
layout pass would remove.
"""
from __future__ import annotations

from collections import Counter, defaultdict

# Built-in functions that only move data (each one kernel of copying); builtin.reshape is a
# view and launches nothing.
COPY_COMPOSITES = ("builtin.layout", "builtin.transpose", "builtin.strided_slice", "builtin.concat",
                   "builtin.concat_views", "builtin.pad", "builtin.broadcast_to", "builtin.tile")
VIEW_COMPOSITES = ("builtin.reshape",)


class PartitionReport:
    def __init__(self):
        self.accepted = defaultdict(Counter)  # backend -> pattern -> matches taken
        self.ops = defaultdict(Counter)  # backend -> op -> calls it covers
        self.refused = []  # dicts: backend, pattern, op, reason
        self.functions = {}  # backend -> {"unique": n, "call_sites": n}
        self.calls_per_run = 0  # calls of backend functions in main, views left out
        self.copies = Counter()  # copy composite (COPY_COMPOSITES) -> calls per run
        # partition: measured: what was said about it, and each placement of the chosen
        # cover with the alternatives weighed there (record_cover)
        self.measured = None

    def note_measurement(self, text: str):
        self.measured = self.measured or {"notes": [], "decisions": [], "cost_us": None}
        self.measured["notes"].append(text)

    def record_cover(self, cover, names: list):
        """The chosen cover (cheapest_cover.Cover) as the report keeps it: per placement, the
        node's name, the candidate chosen and its cost, and the alternatives with the cost of
        the cheapest whole cover that places each (or why none does); `names`: the name
        of each node (main's bindings)."""
        self.measured = self.measured or {"notes": [], "decisions": [], "cost_us": None}
        self.measured["cost_us"] = round(cover.cost_us, 3)

        def label(candidate):
            return f"{candidate.backend}.{candidate.name}" if candidate.name else candidate.backend
        for decision in cover.decisions:
            if not decision.alternatives:
                continue  # an op only the built-in backend runs: nothing was chosen there
            self.measured["decisions"].append({
                "node": names[decision.node], "chosen": label(decision.chosen),
                "cost_us": round(decision.chosen.cost_us, 3), "cover_us": round(decision.cost_us, 3),
                "alternatives": [{"candidate": label(a.candidate), "cost_us": round(a.candidate.cost_us, 3),
                                  "cover_us": None if a.cost_us is None else round(a.cost_us, 3),
                                  **({"why_not": a.why_not} if a.why_not else {})} for a in decision.alternatives]})

    def accept(self, backend: str, pattern: str, ops: list):
        self.accepted[backend][pattern] += 1
        self.ops[backend].update(ops)

    def refuse(self, backend: str, pattern: str, op: str, reason: str, node: str | None = None):
        """`node`: the name of the value the refused match would have produced (for an ONNX
        model, the node's output name), so that a refusal can be found in the model."""
        entry = {"backend": backend, "pattern": pattern, "op": op, "reason": reason}
        if node is not None:
            entry["node"] = node
        self.refused.append(entry)

    def count_functions(self, mod):
        """Unique outlined functions and their call sites in main, per backend."""
        from .ir.expr import Call, GlobalVar
        backend_of = {name: str(f.attrs["Compiler"]) for name, f in mod.functions.items() if "Compiler" in f.attrs}
        composite_of = {name: str(f.attrs.get("Composite", "")) for name, f in mod.functions.items()}
        call_sites = Counter()
        self.calls_per_run, self.copies = 0, Counter()
        for binding in mod["main"].bindings:
            value = binding.value
            if isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in backend_of:
                call_sites[backend_of[value.op.name]] += 1
                composite = composite_of[value.op.name]
                if composite not in VIEW_COMPOSITES:
                    self.calls_per_run += 1
                if composite in COPY_COMPOSITES:
                    self.copies[composite] += 1
        unique = Counter(backend_of.values())
        self.functions = {b: {"unique": unique[b], "call_sites": call_sites[b]} for b in sorted(unique)}

    def ir_summary(self) -> str:
        """How a module dump lists it (pipeline.py: the partition_report attribute)."""
        return "; ".join(f"{b}: {f['call_sites']} calls of {f['unique']} functions"
                         for b, f in self.functions.items()) + f"; {len(self.refused)} refused matches"

    def to_json(self) -> dict:
        backends = sorted(set(self.functions) | set(self.accepted) | {r["backend"] for r in self.refused})
        refused_count = Counter(r["backend"] for r in self.refused)
        return {
            "backends": {b: {"partitions": self.functions.get(b, {}).get("call_sites", 0),
                             "unique_functions": self.functions.get(b, {}).get("unique", 0),
                             "composites": sum(self.accepted.get(b, Counter()).values()),
                             "patterns": dict(self.accepted.get(b, {})),
                             "ops_covered": dict(self.ops.get(b, {})),
                             "refused": refused_count.get(b, 0)} for b in backends},
            "refused": self.refused,
            "calls_per_run": self.calls_per_run,
            "copies_per_run": {name.split(".", 1)[1]: n for name, n in sorted(self.copies.items())},
            **({"measured": self.measured} if self.measured is not None else {}),
        }

    @staticmethod
    def from_json(data: dict) -> "PartitionReport":
        """The report `to_json()` wrote (as embedded in a library's metadata)."""
        report = PartitionReport()
        for backend, entry in data.get("backends", {}).items():
            report.accepted[backend].update(entry.get("patterns", {}))
            report.ops[backend].update(entry.get("ops_covered", {}))
            report.functions[backend] = {"unique": entry.get("unique_functions", 0),
                                         "call_sites": entry.get("partitions", 0)}
        report.refused = [dict(r) for r in data.get("refused", [])]
        report.calls_per_run = int(data.get("calls_per_run", 0))
        report.copies = Counter({f"builtin.{name}": n for name, n in data.get("copies_per_run", {}).items()})
        report.measured = data.get("measured") if isinstance(data.get("measured"), dict) else None
        return report

    def to_text(self) -> str:
        data = self.to_json()
        lines = ["backend      partitions  unique  composites  refused  ops covered", "-" * 76]
        for backend, entry in data["backends"].items():
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(entry["ops_covered"].items())) or "-"
            lines.append(f"{backend:<12} {entry['partitions']:>10}  {entry['unique_functions']:>6}  "
                         f"{entry['composites']:>10}  {entry['refused']:>7}  {ops}")
        if self.calls_per_run:
            copies = sum(self.copies.values())
            kinds = ", ".join(f"{name} x{n}" for name, n in sorted(data["copies_per_run"].items(),
                                                                   key=lambda item: (-item[1], item[0])))
            lines += ["", f"calls per run: {self.calls_per_run}, of which {copies} only move data"
                      + (f" ({kinds})" if kinds else "")]
        if self.measured is not None:
            lines += [""] + list(self.measured.get("notes", []))
            decisions = self.measured.get("decisions", [])
            if decisions:
                lines.append(f"chosen by measurement (whole model {self.measured.get('cost_us')} us of the "
                             f"candidates' time), each against the cheapest cover with another choice there:")
            for decision in decisions:
                others = "; ".join(f"{a['candidate']} {a['cost_us']:g} us (cover {a['cover_us']:g} us)"
                                   if a["cover_us"] is not None else f"{a['candidate']}: {a.get('why_not', '')}"
                                   for a in decision["alternatives"])
                lines.append(f"  %{decision['node']}: {decision['chosen']} {decision['cost_us']:g} us "
                             f"(cover {decision['cover_us']:g} us) over {others}")
        if self.refused:
            lines += ["", "refused matches:"]
            counted = Counter((r["backend"], r["pattern"], r["reason"]) for r in self.refused)
            nodes = defaultdict(list)
            for r in self.refused:
                if "node" in r:
                    nodes[(r["backend"], r["pattern"], r["reason"])].append(r["node"])
            for (backend, pattern, reason), count in sorted(counted.items()):
                where = nodes.get((backend, pattern, reason), [])
                shown = ", ".join(f"%{n}" for n in where[:3]) + (", ..." if len(where) > 3 else "")
                lines.append(f"  {backend}.{pattern} x{count}: {reason}" + (f" ({shown})" if shown else ""))
        return "\n".join(lines)
