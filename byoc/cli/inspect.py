"""`byoc inspect` (a built library's or an ONNX model's interface) and `byoc report` (a build
as one HTML page)."""
from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path


def inspect_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("library", help="a model library built by byoc, or an ONNX model (its interface before building)")
    parser.add_argument("--json", action="store_true", help="print the metadata JSON as the library carries it "
                        "(for an ONNX model: its interface as JSON)")


def _is_elf(path) -> bool:
    """Whether `path` is an ELF file; True for anything but a readable regular file, whose
    problem the library loader then names (reading a FIFO would wait for a writer)."""
    import stat
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return True
        with open(path, "rb") as file:
            return file.read(4) == b"\x7fELF"
    except (OSError, ValueError):
        return True


# What the printers raise on metadata a byoc build did not write (a key missing, a list
# where an object was, round() of an infinite number): the file's fault, named as such.
_EDITED_METADATA_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError)


def inspect_command(args: argparse.Namespace) -> int:
    import json

    from ..errors import ConfigError
    from ..user_text import printable, printable_tree
    # json.dumps escapes every control character (ensure_ascii); the text printers get the
    # model's or library's strings escaped first: names in a file handed over may carry
    # terminal escape sequences
    # an ONNX model: neither an ELF file nor named like a library (a .so whose header is
    # corrupted is reported as a library)
    if not _is_elf(args.library) and ".so" not in Path(args.library).suffixes:
        from ..frontend.onnx import describe_model
        description = describe_model(args.library)
        print(json.dumps(description, indent=2, sort_keys=True) if args.json else
              describe_onnx_model(printable(args.library), printable_tree(description)))
        return 0
    from ..runtime import metadata_of
    metadata = metadata_of(args.library)
    if args.json:
        print(json.dumps(metadata, indent=2, sort_keys=True))
        return 0
    try:
        text = describe_library(printable(args.library), printable_tree(metadata))
    except _EDITED_METADATA_ERRORS as error:
        raise ConfigError(f"{printable(args.library)}: its metadata is not what a byoc build writes "
                          f"({type(error).__name__}: {printable(error)}); rebuild it") from None
    print(text)
    return 0


def describe_onnx_model(path, description: dict) -> str:
    """What `byoc inspect MODEL.onnx` prints: what a build needs to know before it starts."""
    def dims(entry):
        return "[" + ", ".join(str(d) for d in entry["dims"]) + "]" if entry["dims"] is not None else "(no shape)"
    opsets = ", ".join(f"{domain} {version}" for domain, version in sorted(description["opsets"].items()))
    lines = [f"{path}: ONNX (ir {description['ir_version']}, opset {opsets}; {description['producer'] or 'unknown producer'}),"
             f" {description['nodes']} nodes, {description['initializers']} initializers "
             f"({description['initializer_bytes'] / (1 << 20):.1f} MiB)"]
    for kind in ("inputs", "outputs"):
        for entry in description[kind]:
            lines.append(f"  {kind[:-1]:<6} {entry['name']}: {entry['dtype']} {dims(entry)}")
    if description["named_dims"]:
        named = "; ".join(f"{name} ({', '.join(where)})" for name, where in description["named_dims"].items())
        example = " ".join(f"--input-shape {entry['name']}={','.join(str(d) if isinstance(d, int) else '1' for d in entry['dims'])}"
                           for entry in description["inputs"] if entry["dims"] and any(isinstance(d, str) for d in entry["dims"]))
        lines.append(f"  dims to fix when building: {named}")
        lines.append(f"    e.g. byoc build {path} {example}")
    ops = ", ".join(f"{op} x{count}" for op, count in description["op_types"].items())
    lines.append(textwrap.fill(f"ops: {ops}", width=100, initial_indent="  ", subsequent_indent="    "))
    if description["unsupported"]:
        lines.append(f"  not imported by byoc: {', '.join(description['unsupported'])} (byoc ops lists what is)")
    return "\n".join(lines)


def _bucketed_shape(kind: str, position: int, variants: list, dims: dict) -> str | None:
    """A shape-bucket library's tensor with its named axes: (batch 1..32, sequence 1..512,
    768) where the dim pads (any size up to its largest bucket runs), (sequence 128|512)
    where only the buckets' own sizes do, the extent where every bucket has the same. None
    for a library of one program."""
    tensors = [variant.get(kind, []) for variant in variants]
    if len(variants) < 2 or any(len(t) <= position for t in tensors) or \
            len({len(t[position].get("shape", ())) for t in tensors}) != 1:
        return None  # not the metadata byoc writes: the caller prints the library's own shape
    parts = []
    for axis, extent in enumerate(tensors[0][position]["shape"]):
        extents = sorted({t[position]["shape"][axis] for t in tensors})
        name = (tensors[0][position].get("axis_dims") or [None] * (axis + 1))[axis]
        dim = dims.get(name) or {}
        size = variants[0].get("dims", {}).get(name)
        if name and dim.get("paddable") and len(dim.get("range") or ()) == 2 and isinstance(size, int) and size > 0 \
                and extent % size == 0:
            factor = extent // size
            parts.append(f"{'' if factor == 1 else f'{factor}*'}{name} {dim['range'][0]}..{dim['range'][1]}")
        elif len(extents) > 1:
            parts.append("|".join(map(str, extents)))
        else:
            parts.append(str(extent))
    return f"({', '.join(parts)})"


def describe_library(path, metadata: dict) -> str:
    """What `byoc inspect` prints: the library's interface, backends, memory plan and
    partition report, from the metadata it carries."""
    from ..report import PartitionReport
    mib = 1 << 20
    archs = metadata.get("archs")
    lines = [f"{path}: build {metadata.get('build_id')}, target {metadata.get('target')}"
             f"{', ' + ', '.join(archs) if archs else ', ' + metadata['arch'] if metadata.get('arch') else ''}, "
             f"cuda graph {'on' if metadata.get('cuda_graph') else 'off'}"]
    variants = metadata.get("variants") or []
    for kind in ("inputs", "outputs"):
        for position, tensor in enumerate(metadata.get(kind, [])):
            where = f" on {tensor['device']}" if "device" in tensor else ""
            shape = _bucketed_shape(kind, position, variants, metadata.get("dims") or {}) or tuple(tensor["shape"])
            lines.append(f"  {kind[:-1]:<6} {tensor['name']}: {tensor['dtype']} {shape}{where}")
    if variants:  # shape buckets or archs: a program each, over the one set of weights
        lines.append(f"  {len(variants)} archs (create takes the highest the GPU runs, else the highest PTX it compiles; BYOC_ARCH=sm_NN "
                     f"asks for one):" if archs else
                     f"  {len(variants)} shape buckets (run() takes the one the inputs' shapes fit):")
        for variant in variants:
            dims = ", ".join([f"{name}={size}" for name, size in variant.get("dims", {}).items()] +
                             ([variant["arch"]] if "arch" in variant else []))
            shapes = ", ".join(f"{t['name']} {tuple(t['shape'])}" for t in variant.get("inputs", []))
            arena = variant.get("memory", {}).get("arena_bytes", 0)
            lines.append(f"    {dims}: {shapes}; arena {arena / mib:.2f} MiB")
        for name, dim in sorted((metadata.get("dims") or {}).items()):
            if "paddable" not in dim:
                continue
            verdict = f"any size from 1 to {max(dim.get('sizes') or [0])} runs, padded into the next bucket" \
                if dim["paddable"] \
                else f"sizes between them cannot be padded: {dim.get('why_not')}"
            lines.append(f"    {name} {', '.join(map(str, dim.get('sizes', [])))}: {verdict}")
    weights = metadata.get("weights", {})
    lines.append(f"  weights: {weights.get('bytes', 0) / mib:.1f} MiB, {weights.get('location')}")
    calls = {}
    for function in metadata.get("functions", []):
        entry = calls.setdefault(function["backend"], [0, 0])
        entry[0] += 1
        entry[1] += function["calls"]
    for backend, (functions, count) in sorted(calls.items()):
        lines.append(f"  backend {backend}: {functions} functions, {count} calls per run")
    memory = metadata.get("memory", {})
    plan = memory.get("plan")
    if plan and not plan.get("planned_bytes"):  # every value is an input, output or weight
        lines.append(f"  memory: no planned tensors, workspace {memory.get('workspace_bytes', 0) / mib:.2f} MiB")
    elif plan:
        lines.append(f"  memory: planned {plan['planned_bytes'] / mib:.2f} MiB, lower bound "
                     f"{plan['lower_bound_bytes'] / mib:.2f} MiB ({plan.get('over_lower_bound')}x), no reuse "
                     f"{plan['no_reuse_bytes'] / mib:.2f} MiB ({plan.get('reuse_factor')}x the plan), "
                     f"workspace {memory.get('workspace_bytes', 0) / mib:.2f} MiB")
    if metadata.get("partition_report"):
        lines += ["", PartitionReport.from_json(metadata["partition_report"]).to_text()]
    return "\n".join(lines)


def report_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("build", help="a model library built by byoc, or a build's workdir (its metadata.json)")
    parser.add_argument("-o", "--output", help="the HTML file to write (default: report.html in the workdir, "
                        "or beside the library as NAME.report.html)")
    parser.add_argument("--onnx", metavar="OUT.onnx", help="also write the partitioned graph as ONNX (one node per "
                        "call, typed by its patterns, in domain byoc.<backend>), for a model viewer such as Netron")


def report_command(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..json_files import read_json
    from ..report_page import render_page
    source = Path(args.build)
    if source.is_dir():
        metadata_path = source / "metadata.json"
        if not os.path.lexists(metadata_path):
            raise ConfigError(f"{source} has no metadata.json; expected a build's workdir (byoc build --workdir) "
                              f"or a built library")
        # guarded: the workdir may come from elsewhere (a FIFO, a link to /dev/zero, JSON nested
        # past the stack, numbers that overflow the page's arithmetic)
        metadata = read_json(metadata_path, "a build's metadata", ConfigError)
        output = Path(args.output) if args.output else source / "report.html"
        title = source.name
    else:
        from ..runtime import metadata_of
        metadata = metadata_of(source)
        output = Path(args.output) if args.output else source.with_name(source.name.split(".")[0] + ".report.html")
        title = source.name
    if not isinstance(metadata, dict):
        raise ConfigError(f"{args.build}: its metadata is not a JSON object; expected a byoc build's")
    try:
        page = render_page(metadata, title=title)
    except _EDITED_METADATA_ERRORS as error:  # an edited metadata.json
        raise ConfigError(f"{args.build}: its metadata is not what a byoc build writes ({type(error).__name__}: "
                          f"{error}); rebuild it, or restore metadata.json") from None
    try:
        output.write_text(page)
    except OSError as error:
        raise ConfigError(f"--output {output}: cannot write it ({error.strerror or error})") from None
    print(output)
    if args.onnx:
        import onnx
        from ..report_page import partitioned_onnx
        try:
            onnx.save(partitioned_onnx(metadata, title), args.onnx)
        except _EDITED_METADATA_ERRORS as error:
            raise ConfigError(f"{args.build}: its metadata is not what a byoc build writes ({type(error).__name__}: "
                              f"{error}); rebuild it, or restore metadata.json") from None
        except OSError as error:
            raise ConfigError(f"--onnx {args.onnx}: cannot write it ({error.strerror or error})") from None
        print(args.onnx)
    return 0
