"""The build-time table from what `bash bench/gpu_session.sh build_times` brought back
(build_times.tar.gz: each build's record and log, and the libraries timed).

    python3 bench/build_times.py DIR [DIR ...] --out bench/results
Each DIR is an unpacked archive (one device call; the rows of several calls are put
together); writes build_times.json and build_times.md.
"""
import argparse
import json
from pathlib import Path

KINDS = {"cold": "cold, shipped database", "warm": "warm (every object cached)",
         "measure": "cold, every CUTLASS kernel measured"}


def read(folder: Path, limit_s: float) -> dict:
    timing = json.loads((folder / "real_models.json").read_text()) if (folder / "real_models.json").exists() else {}
    run_ms = {row["case"].split(":")[0]: (row.get("byoc") or {}).get("cuda_sm90", {}).get("ms")
              for row in timing.get("rows", [])}
    measured = folder / "measure" / "real_models.json"  # the measure build's run, timed after the others
    measured_ms = {row["case"].split(":")[0]: (row.get("byoc") or {}).get("cuda_sm90:measure", {}).get("ms")
                   for row in (json.loads(measured.read_text()).get("rows", []) if measured.exists() else [])}
    rows = []
    for log in sorted(folder.glob("*.log")):
        name, _, kind = log.stem.partition(".")
        if kind not in KINDS:
            continue
        records = sorted(folder.glob(f"{name}.{kind}.{name}_b*.json"))
        row = {"model": name, "build": kind,
               "run_ms": run_ms.get(name) if kind == "cold" else measured_ms.get(name) if kind == "measure" else None}
        if records:
            record = json.loads(records[0].read_text())
            stats = record.get("build_stats") or {}
            row.update({"build_s": record["build_s"], "compile_units": stats.get("compile_units"),
                        "compiled": stats.get("compiled"), "compile_seconds": stats.get("compile_seconds"),
                        "slowest_units": stats.get("slowest_units")})
        else:  # cut by the stage's time limit
            row.update({"build_s": None, "note": f"not finished within {limit_s:g} s (the stage's limit)"})
        rows.append(row)
    return {"device": timing.get("device"), "date": timing.get("date"),
            "byoc_commit": (timing.get("versions") or {}).get("byoc_commit"), "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"# Build times ({result['device']}, {result['date']})", "",
             f"byoc {result['byoc_commit']}, `cuda_sm90`, from `bash bench/gpu_session.sh build_times` "
             "(16 CPU cores). Cold: an empty object cache (a fresh BYOC_CACHE_DIR); warm: the "
             "same cache, a new work directory. Run: `module.run` on torch CUDA tensors of that build (the warm build's "
             "library is the cold one's), ms.", "",
             "| model | build | seconds | compile units (compiled) | nvcc wall s | slowest unit s | run ms |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        slowest = (row.get("slowest_units") or [{}])[0].get("seconds", "-")
        seconds = row["build_s"] if row.get("build_s") is not None else row.get("note", "-")
        lines.append(f"| {row['model']} | {KINDS[row['build']]} | {seconds} | {row.get('compile_units', '-')} "
                     f"({row.get('compiled', '-')}) | {row.get('compile_seconds', '-')} | {slowest} | "
                     f"{row['run_ms'] if row.get('run_ms') is not None else '-'} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--measure-limit", type=float, default=150, help="the call's MEASURE_S")
    parser.add_argument("--notes", type=Path, help="a markdown file appended to the table (what changed, what is left)")
    args = parser.parse_args()
    results = [read(folder, args.measure_limit) for folder in args.folders]
    # a folder may hold an earlier call's records too (a machine kept warm between calls):
    # one row per model and build, the one timed where there is a choice
    rows = {}
    for row in (row for part in results for row in part["rows"]):
        key = (row["model"], row["build"])
        if key not in rows or (rows[key].get("run_ms") is None and row.get("run_ms") is not None):
            rows[key] = row
    result = {**results[0], "rows": list(rows.values()),
              "byoc_commit": " / ".join(sorted({str(part["byoc_commit"]) for part in results}))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "build_times.json").write_text(json.dumps(result, indent=1))
    (args.out / "build_times.md").write_text(markdown(result) + ("\n" + args.notes.read_text() if args.notes else ""))
    print(markdown(result))


if __name__ == "__main__":
    main()
