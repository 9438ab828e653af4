"""The suite's report: a table of outcomes per family and group, failures grouped by a
root-cause signature (one example each), and a JSON file of every result."""
from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from pathlib import Path

from .runner import FAILING, INFORMATIONAL, OUTCOMES, Result

EXAMPLES_PER_GROUP = 1
SHOWN_GROUPS = 60


def table(results: list[Result], by: str = "family") -> str:
    """Counts per family (or family/group) and outcome, outcomes that occur only."""
    rows: dict[str, Counter] = defaultdict(Counter)
    for result in results:
        key = result.case.family if by == "family" else f"{result.case.family}/{result.case.group}"
        rows[key][result.outcome] += 1
    columns = [o for o in OUTCOMES if any(row[o] for row in rows.values())]
    width = max([len(k) for k in rows] + [len("total")])
    head = f"{'':{width}}  " + "  ".join(f"{c:>{max(len(c), 5)}}" for c in columns) + "  total"
    lines = [head]
    totals: Counter = Counter()
    for key in sorted(rows):
        row = rows[key]
        totals.update(row)
        lines.append(f"{key:{width}}  " + "  ".join(f"{row[c]:>{max(len(c), 5)}}" for c in columns)
                     + f"  {sum(row.values()):>5}")
    lines.append(f"{'total':{width}}  " + "  ".join(f"{totals[c]:>{max(len(c), 5)}}" for c in columns)
                 + f"  {sum(totals.values()):>5}")
    return "\n".join(lines)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_PATH = re.compile(r"(/[\w.\-+@]+)+")
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|-?\d+(\.\d+)?(e-?\d+)?")


def signature(result: Result) -> str:
    """What failures of one root cause share: the outcome, the case group and the message
    with names, paths and numbers blanked out."""
    message = result.message.splitlines()[0] if result.message else ""
    message = _QUOTED.sub("'…'", message)
    message = _PATH.sub("PATH", message)
    message = _NUMBER.sub("N", message)
    return f"{result.outcome} | {result.case.family}/{result.case.group} | {message[:140]}"


def failures(results: list[Result], outcomes=FAILING) -> str:
    groups: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        if result.outcome in outcomes:
            groups[signature(result)].append(result)
    if not groups:
        return ""
    lines = [f"{sum(len(g) for g in groups.values())} case(s) in {len(groups)} group(s):"]
    ordered = sorted(groups.items(), key=lambda item: (FAILING.index(item[1][0].outcome)
                                                       if item[1][0].outcome in FAILING else 99, item[0]))
    for key, members in ordered[:SHOWN_GROUPS]:
        lines.append(f"\n[{len(members)}x] {key}")
        for result in members[:EXAMPLES_PER_GROUP]:
            lines.append(f"    e.g. {result.case.id}")
            lines.append(f"         {result.message[:600]}")
            if result.outcome in ("raw", "crash") and result.detail:
                for detail_line in result.detail.strip().splitlines()[-8:]:
                    lines.append(f"         | {detail_line[:200]}")
        if len(members) > EXAMPLES_PER_GROUP:
            others = ", ".join(r.case.name for r in members[EXAMPLES_PER_GROUP:EXAMPLES_PER_GROUP + 6])
            lines.append(f"    also: {others}{' ...' if len(members) > EXAMPLES_PER_GROUP + 6 else ''}")
    if len(ordered) > SHOWN_GROUPS:
        lines.append(f"\n... and {len(ordered) - SHOWN_GROUPS} more group(s); see the JSON report")
    return "\n".join(lines)


def render(title: str, results: list[Result], seconds: float) -> str:
    parts = [f"== robustness: {title}: {len(results)} cases in {seconds:.1f} s ==", table(results, by="group")]
    failing = failures(results)
    if failing:
        parts.append("FAILING " + failing)
    informational = failures(results, outcomes=INFORMATIONAL)
    if informational:
        parts.append("informational (not failures) " + informational)
    return "\n".join(parts)


def write_json(path: Path, results: list[Result]):
    records = [{"id": r.case.id, "family": r.case.family, "group": r.case.group, "name": r.case.name,
                "expect": r.case.expect, "outcome": r.outcome, "message": r.message, "detail": r.detail,
                "seconds": round(r.seconds, 3), "signature": signature(r)} for r in results]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(records, indent=1))


def report_path(title: str) -> Path | None:
    """Where the JSON report goes: $BYOC_ROBUSTNESS_REPORT_DIR (default: none written)."""
    folder = os.environ.get("BYOC_ROBUSTNESS_REPORT_DIR")
    return Path(folder) / (re.sub(r"[^A-Za-z0-9_-]+", "_", title).strip("_") + ".json") if folder else None
