"""The partition report: per backend, the partitions (the call sites of its outlined
functions), the unique functions, the composites matched and ops covered, and every
refused match with the reason. `to_json()` is written next to the build; `to_text()` is
the readable table:

    backend      partitions  unique  composites  refused  ops covered
    ----------------------------------------------------------------------------
    cutlass              96       4          96       12  add x96, gelu x12, matmul x96

    refused matches:
      cutlass.dense_bias x12: K=770 not a multiple of 8
"""
from __future__ import annotations

from collections import Counter, defaultdict


class PartitionReport:
    def __init__(self):
        self.accepted = defaultdict(Counter)  # backend -> pattern -> matches taken
        self.ops = defaultdict(Counter)  # backend -> op -> calls it covers
        self.refused = []  # dicts: backend, pattern, op, reason
        self.functions = {}  # backend -> {"unique": n, "call_sites": n}

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
        call_sites = Counter()
        for binding in mod["main"].bindings:
            value = binding.value
            if isinstance(value, Call) and isinstance(value.op, GlobalVar) and value.op.name in backend_of:
                call_sites[backend_of[value.op.name]] += 1
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
        return report

    def to_text(self) -> str:
        data = self.to_json()
        lines = ["backend      partitions  unique  composites  refused  ops covered", "-" * 76]
        for backend, entry in data["backends"].items():
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(entry["ops_covered"].items())) or "-"
            lines.append(f"{backend:<12} {entry['partitions']:>10}  {entry['unique_functions']:>6}  "
                         f"{entry['composites']:>10}  {entry['refused']:>7}  {ops}")
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
