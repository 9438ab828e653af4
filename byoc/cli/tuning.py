"""`byoc tuning show|merge|export`: the CUTLASS tuning databases."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..user_text import printable
from .common import EXIT_OK, UsageError


def tuning_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("action", choices=("show", "merge", "export"),
                        help="show: list databases' entries (default: the persistent one and the shipped one); "
                             "merge: combine databases into -o (default: the persistent one); "
                             "export: copy the persistent database to -o, to share it")
    parser.add_argument("databases", nargs="*", metavar="DB.json", help="tuning databases (show, merge)")
    parser.add_argument("-o", "--output", metavar="OUT.json", help="where merge and export write")


def tuning_command(args: argparse.Namespace) -> int:
    from ..backends.cutlass.tuning import (FORMAT, SHIPPED_DATABASE, TuningDatabase, default_database_path,
                                          merge_entries)
    persistent = default_database_path()
    if args.action == "show":
        paths = [Path(p) for p in args.databases] or [p for p in (persistent, SHIPPED_DATABASE) if p.exists()]
        if not paths:
            print(f"no tuning database yet (tuning writes {persistent})")
        for path in paths:
            _require_file(path)
            database = TuningDatabase(path)
            count = sum(len(entries) for entries in database.entries.values())
            print(f"{printable(path)}: {count} entries")
            for arch, entries in sorted(database.entries.items()):
                for key, entry in sorted(entries.items()):
                    if not isinstance(entry, dict):
                        continue
                    # a shared database is someone else's text: shown with its control characters
                    # escaped, so that an entry cannot drive the terminal
                    where = ", ".join(str(entry[k]) for k in ("device", "cuda", "cutlass", "date") if entry.get(k))
                    timing = f"{entry['us']:.2f} us" if isinstance(entry.get("us"), (int, float)) else "- us"
                    name = "no candidate ran (the heuristic's kernel is used)" if entry.get("failed") else \
                        entry.get("name", "?")
                    print(printable(f"  {arch}  {key}  {name}  {timing}  ({where or 'measured where: unknown'})"))
        return EXIT_OK
    if args.action == "export":
        if args.databases:
            raise UsageError("byoc tuning export takes no databases: it writes the persistent one "
                             f"({persistent}) to -o")
        if not args.output:
            raise UsageError("byoc tuning export needs -o OUT.json")
        if not persistent.exists():
            raise UsageError(f"no persistent tuning database at {persistent} yet; a build that tunes writes it")
        sources = [persistent]
    else:
        if not args.databases:
            raise UsageError("byoc tuning merge needs at least one DB.json")
        sources = [Path(p) for p in args.databases]
        if not args.output and persistent.exists():
            sources = [persistent] + sources  # merged into what builds already use
    for path in sources:
        _require_file(path)
    entries, conflicts = merge_entries([TuningDatabase(path) for path in sources])
    output = TuningDatabase(None)
    output.path, output.entries = Path(args.output) if args.output else persistent, entries
    output.save()
    count = sum(len(e) for e in entries.values())
    print(f"{output.path}: {count} entries from {len(sources)} database(s) ({FORMAT}); "
          f"{conflicts} problem(s) held by more than one")
    return EXIT_OK


def _require_file(path: Path):
    if not path.exists():
        raise UsageError(f"{printable(path)}: no such tuning database file")
    # anything else that is there (a FIFO, a device, a directory) the guarded reader names
