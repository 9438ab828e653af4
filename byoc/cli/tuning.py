"""`byoc tuning show|merge|export`: the CUTLASS tuning databases, and the cost store of
partitioning by measurement (byoc/costs.py): a file's own format says which it is."""
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
    parser.add_argument("databases", nargs="*", metavar="DB.json",
                        help="tuning databases or cost stores (show, merge; all of one kind for merge)")
    parser.add_argument("-o", "--output", metavar="OUT.json", help="where merge and export write")
    parser.add_argument("--costs", action="store_true",
                        help="export: the cost store of partition: measured instead of the tuning database")


def tuning_command(args: argparse.Namespace) -> int:
    from ..backends.cutlass.tuning import (FORMAT, SHIPPED_DATABASE, TuningDatabase, default_database_path,
                                          merge_entries)
    from ..costs import default_store_path
    persistent = default_database_path()
    stores = [Path(p) for p in args.databases if _is_cost_store(Path(p))]
    if args.action != "show" and (args.costs or stores):
        return _costs_command(args, stores)
    if args.action == "show":
        paths = [Path(p) for p in args.databases] or \
            [p for p in (persistent, SHIPPED_DATABASE, default_store_path()) if p.exists()]
        if not paths:
            print(f"no tuning database yet (tuning writes {persistent})")
        for path in paths:
            _require_file(path)
            if _is_cost_store(path):
                _show_costs(path)
                continue
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


def _is_cost_store(path: Path) -> bool:
    """Whether the file is a cost store (its format, read from its first bytes)."""
    from ..costs import FORMAT
    if not path.is_file():  # (a FIFO would block the open; the guarded reader names what it is)
        return False
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        return False
    return f'"format": "{FORMAT}"'.encode() in head or f'"format":"{FORMAT}"'.encode() in head


def _show_costs(path: Path):
    from ..costs import CostStore
    store = CostStore(path)
    count = sum(len(entries) for entries in store.entries.values())
    print(f"{printable(path)}: {count} candidate costs (partition: measured)")
    for device, entries in sorted(store.entries.items()):
        # a shared store is someone else's text: entries of another form are left out
        shown = [(key, entry) for key, entry in entries.items() if isinstance(entry, dict)]
        for key, entry in sorted(shown, key=lambda item: str(item[1].get("ops", ""))):
            timing = f"failed: {entry['failed']}" if "failed" in entry else \
                f"{entry['us']:.2f} us" if isinstance(entry.get("us"), (int, float)) else "- us"
            print(printable(f"  {device}  {entry.get('backend', '?')}: {entry.get('ops', '?')}  {timing}  "
                            f"({entry.get('date', 'date unknown')}; {key})"))


def _costs_command(args: argparse.Namespace, stores: list) -> int:
    """export --costs / merge of cost stores: as for tuning databases."""
    from ..costs import FORMAT, CostStore, default_store_path, merge_cost_entries
    persistent = default_store_path()
    if args.action == "export":
        if args.databases:
            raise UsageError(f"byoc tuning export --costs takes no files: it writes the persistent cost store "
                             f"({persistent}) to -o")
        if not args.output:
            raise UsageError("byoc tuning export --costs needs -o OUT.json")
        if not persistent.exists():
            raise UsageError(f"no cost store at {persistent} yet; a build with partition: measured writes it")
        sources = [persistent]
    else:
        if len(stores) != len(args.databases):
            raise UsageError("byoc tuning merge: the files are not all of one kind (tuning databases and cost "
                             "stores are merged separately)")
        sources = stores
        if not args.output and persistent.exists():
            sources = [persistent] + sources
    for path in sources:
        _require_file(path)
    entries, conflicts = merge_cost_entries([CostStore(path) for path in sources])
    output = CostStore.__new__(CostStore)
    output.path, output.entries = Path(args.output) if args.output else persistent, entries
    output.save(merge=False)
    count = sum(len(e) for e in entries.values())
    print(f"{output.path}: {count} candidate costs from {len(sources)} store(s) ({FORMAT}); "
          f"{conflicts} candidate(s) held by more than one")
    return EXIT_OK


def _require_file(path: Path):
    if not path.exists():
        raise UsageError(f"{printable(path)}: no such tuning database file")
    # anything else that is there (a FIFO, a device, a directory) the guarded reader names
