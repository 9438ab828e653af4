"""The build as a picture: one self-contained HTML page (no network at view time) showing
what runs where, for a person to look at rather than read.

    render_page(metadata, title)                the page: the backends and their coverage,
        the calls laid out in one lane per backend with the tensors between them, every
        refused pattern match with its reason, and the memory plan as tensor lifetimes
        against arena offsets

It draws from the library's metadata alone (metadata.py builds it: the calls, the memory
plan's lifetimes and each function's ops), so a built .so can be drawn without its build
directory. `byoc report model.so|WORKDIR` writes it; every build writes `report.html` into its
workdir. The page is one Jinja template (templates/report/page.html.j2) fed plain data;
the SVG geometry is computed here. Names come from models: the template escapes them.
"""
from __future__ import annotations

from collections import Counter, defaultdict


# backend -> fill colour; others take the palette in order of appearance
BACKEND_COLORS = {"cutlass": "#76b900", "cudnn": "#b07aa1", "cublaslt": "#f28e2b", "builtin": "#4e79a7"}
PALETTE = ["#59a14f", "#e15759", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"]
LANE_WIDTH, BOX_WIDTH, ROW_HEIGHT, TOP = 300, 270, 30, 56
TIMELINE_WIDTH, TIMELINE_HEIGHT = 900, 320


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.2f} MiB" if count >= 1 << 16 else f"{count:,} B"


def _shape(value: dict) -> str:
    return f"{value['dtype']}[{', '.join(map(str, value['shape']))}]"


def _colors(backends: list) -> dict:
    spare = iter(PALETTE)
    return {b: BACKEND_COLORS.get(b) or next(spare, "#999999") for b in backends}


def _summary(function: dict | None) -> str:
    """One line for a call's box: the composites it matched, else its ops."""
    if not function:
        return ""
    if function["composites"]:
        names = Counter(c.split(".", 1)[-1] for c in function["composites"])
        return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in names.items())
    ops = Counter(function["ops"])
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in ops.items())


def _backend(graph: dict, backend_of: dict, symbol: str) -> str:
    if symbol == "device_copy":
        return "copy"
    return graph["functions"].get(symbol, {}).get("backend") or backend_of.get(symbol, "?")


def _tail(name: str, limit: int) -> str:
    """The end of a long name (ONNX paths differ at their ends)."""
    return name if len(name) <= limit else "\u2026" + name[-(limit - 1):]


def _graph_layout(graph: dict, backend_of: dict) -> dict:
    """Boxes (one per call, in its backend's lane, one row per call) and edges (a computed
    tensor from the call that writes it to each call that reads it)."""
    lanes = []
    for call in graph["calls"]:
        backend = _backend(graph, backend_of, call["symbol"])
        if backend not in lanes:
            lanes.append(backend)
    colors = _colors(lanes)
    lane_x = {backend: 20 + i * LANE_WIDTH for i, backend in enumerate(lanes)}
    boxes, centre = [], {}
    values = graph["values"]
    for row, call in enumerate(graph["calls"]):
        backend = _backend(graph, backend_of, call["symbol"])
        function = graph["functions"].get(call["symbol"])
        x, y = lane_x[backend], TOP + row * ROW_HEIGHT
        written = values[call["writes"]]
        inputs = [values[i]["name"] for i in call["reads"]]
        view = call.get("view", False)
        boxes.append({"x": x, "y": y, "width": BOX_WIDTH, "height": ROW_HEIGHT - 8, "color": colors[backend],
                      "view": view, "label": f"#{call['position']} {_tail(written['name'], 38)}",
                      "detail": ("view, no kernel: " if view else "") + _summary(function)[:44],
                      "tooltip": "\n".join(filter(None, [
                          f"#{call['position']} {written['name']} = {call['symbol']}({', '.join(inputs)})",
                          f"backend: {backend}", f"writes {_shape(written)}",
                          f"weights read: {call['weights']}" if call["weights"] else "",
                          f"patterns: {', '.join(function['composites'])}" if function and function["composites"]
                          else "",
                          f"ops: {', '.join(function['ops'])}" if function and function["ops"] else "",
                          f"kernel: {function['kernel']}" if function and function.get("kernel") else ""]))})
        centre[call["writes"]] = (x + BOX_WIDTH / 2, y + ROW_HEIGHT - 8)
    edges = []
    for row, call in enumerate(graph["calls"]):
        x, y = boxes[row]["x"] + BOX_WIDTH / 2, boxes[row]["y"]
        for read in call["reads"]:
            if read in centre:
                x0, y0 = centre[read]
                bend = max(12.0, (y - y0) / 2)
                edges.append(f"M{x0:.0f},{y0:.0f} C{x0:.0f},{y0 + bend:.0f} {x:.0f},{y - bend:.0f} {x:.0f},{y:.0f}")
    width = 40 + LANE_WIDTH * max(1, len(lanes))
    return {"lanes": [{"name": b, "x": lane_x[b], "color": colors[b], "width": LANE_WIDTH - 14} for b in lanes],
            "boxes": boxes,
            "edges": edges, "width": width, "height": TOP + ROW_HEIGHT * len(graph["calls"]) + 10,
            "colors": colors}


def _timeline(graph: dict, backend_of: dict, colors: dict, arena_bytes: int) -> dict | None:
    """The memory plan: one rectangle per planned tensor, its lifetime (bindings) across and
    its arena bytes up."""
    lifetimes = graph.get("lifetimes") or []
    if not lifetimes:
        return None
    top = max([arena_bytes] + [l["offset"] + l["bytes"] for l in lifetimes]) or 1
    steps = max(l["last"] for l in lifetimes) + 1
    left, bottom = 70, 20
    width, height = TIMELINE_WIDTH - left - 10, TIMELINE_HEIGHT - bottom - 10
    values, calls = graph["values"], graph["calls"]
    rects = []
    for l in lifetimes:
        producer = values[l["value"]]["call"]
        backend = _backend(graph, backend_of, calls[producer]["symbol"]) if producer is not None else "?"
        x0 = left + width * l["first"] / steps
        x1 = left + width * (l["last"] + 1) / steps
        y1 = 10 + height * (1 - l["offset"] / top)
        y0 = 10 + height * (1 - (l["offset"] + l["bytes"]) / top)
        value = values[l["value"]]
        rects.append({"x": round(x0, 1), "y": round(y0, 1), "width": round(max(x1 - x0, 1.0), 1),
                      "height": round(max(y1 - y0, 1.0), 1), "color": colors.get(backend, "#999999"),
                      "tooltip": f"{value['name']}: {_shape(value)}, {_mib(l['bytes'])} at offset {l['offset']:,}, "
                                 f"live from binding #{l['first']} to #{l['last']}"})
    unit, scale = ("MiB", 1 << 20) if top >= 1 << 20 else ("KiB", 1 << 10)
    ticks = [{"y": round(10 + height * (1 - f), 1), "label": f"{top * f / scale:.1f} {unit}"}
             for f in (0, 0.25, 0.5, 0.75, 1)]
    return {"rects": rects, "ticks": ticks, "width": TIMELINE_WIDTH, "height": TIMELINE_HEIGHT, "left": left,
            "plot_width": width, "axis_y": 10 + height, "steps": steps}


def render_page(metadata: dict, title: str) -> str:
    """The HTML page of a library's metadata (metadata.json in a workdir, or what a built
    .so carries); builds from before the graph was recorded get the tables alone."""
    from .codegen.templates import render_template
    graph = metadata.get("graph") or {"values": [], "calls": [], "functions": {}, "lifetimes": []}
    backend_of = {f["symbol"]: f["backend"] for f in metadata.get("functions", [])}
    report = metadata.get("partition_report") or {"backends": {}, "refused": []}
    layout = _graph_layout(graph, backend_of)
    memory = metadata.get("memory", {})
    timeline = _timeline(graph, backend_of, layout["colors"], memory.get("arena_bytes", 0))
    refused = defaultdict(list)
    for entry in report.get("refused", []):
        refused[(entry.get("backend", "?"), entry.get("pattern", "?"), entry.get("reason", "?"))].append(
            entry.get("node") or entry.get("op", "?"))
    colors = _colors(sorted(set(report.get("backends", {})) | set(layout["colors"])))
    colors.update(layout["colors"])
    backends = [{"name": name, "color": colors.get(name, "#999999"), "partitions": entry.get("partitions", 0),
                 "functions": entry.get("unique_functions", 0), "composites": entry.get("composites", 0),
                 "refused": entry.get("refused", 0),
                 "ops": ", ".join(f"{op} x{n}" for op, n in sorted(entry.get("ops_covered", {}).items()))}
                for name, entry in sorted(report.get("backends", {}).items())]
    plan = memory.get("plan", {})
    return render_template("report/page.html.j2", {
        "title": title,
        "target": metadata.get("target", "?"), "arch": metadata.get("arch"),
        "cuda_graph": metadata.get("cuda_graph", False), "build_id": metadata.get("build_id", "?"),
        "inputs": [f"{t['name']}: {_shape(t)}" for t in metadata.get("inputs", [])],
        "outputs": [f"{t['name']}: {_shape(t)}" for t in metadata.get("outputs", [])],
        "backends": backends,
        "refused": [{"backend": b, "pattern": p, "reason": r, "count": len(nodes),
                     "nodes": ", ".join(nodes[:6]) + (f" and {len(nodes) - 6} more" if len(nodes) > 6 else "")}
                    for (b, p, r), nodes in sorted(refused.items())],
        "layout": layout, "timeline": timeline,
        "memory": {"arena": _mib(memory.get("arena_bytes", 0)), "workspace": _mib(memory.get("workspace_bytes", 0)),
                   "planned": _mib(plan.get("planned_bytes", 0)) if plan else None,
                   "lower_bound": _mib(plan.get("lower_bound_bytes", 0)) if plan else None,
                   "no_reuse": _mib(plan.get("no_reuse_bytes", 0)) if plan else None},
        "weights": _mib(metadata.get("weights", {}).get("bytes", 0)),
    })


def partitioned_onnx(metadata: dict, title: str):
    """The partitioned model as an ONNX graph a model viewer (Netron) opens: one node per
    call of @main, its op type the function's composite or ops (`dense_bias_gelu`,
    `layer_norm`), its domain `byoc.<backend>`, with the kernel, ops and patterns as
    attributes; the values between calls keep their names, shapes and dtypes. It describes
    the build; it is not a model to run."""
    from onnx import TensorProto, helper
    graph = metadata.get("graph") or {"values": [], "calls": [], "functions": {}}
    backend_of = {f["symbol"]: f["backend"] for f in metadata.get("functions", [])}
    values = graph["values"]
    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16,
            "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64, "int32": TensorProto.INT32,
            "int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "bool": TensorProto.BOOL}

    uses = Counter(value["name"] for value in values)

    def value_name(index: int) -> str:  # unique even where the IR reused a name
        return f"{values[index]['name']}#{index}" if uses[values[index]["name"]] > 1 else values[index]["name"]

    def info(index: int):
        value = values[index]
        return helper.make_tensor_value_info(value_name(index), elem.get(value["dtype"], TensorProto.UNDEFINED),
                                             value["shape"])
    nodes, domains = [], set()
    for call in graph["calls"]:
        function = graph["functions"].get(call["symbol"], {})
        backend = _backend(graph, backend_of, call["symbol"])
        op_type = "_".join(dict.fromkeys(c.split(".", 1)[-1] for c in function.get("composites", []))) or \
            "_".join(dict.fromkeys(function.get("ops", []))) or call["symbol"]
        domain = f"byoc.{backend}"
        domains.add(domain)
        attributes = {"symbol": call["symbol"], "binding": call["position"]}
        if function.get("kernel"):
            attributes["kernel"] = function["kernel"]
        if function.get("ops"):
            attributes["ops"] = ", ".join(function["ops"])
        if call.get("view"):
            attributes["view"] = 1
        nodes.append(helper.make_node(op_type[:120], [value_name(i) for i in call["reads"]],
                                      [value_name(call["writes"])], name=f"#{call['position']}", domain=domain,
                                      **attributes))
    produced = {call["writes"] for call in graph["calls"]}
    read = {i for call in graph["calls"] for i in call["reads"]}
    inputs = [info(i) for i, value in enumerate(values) if value["call"] is None]
    output_names = [o["name"] for o in metadata.get("outputs", [])]
    output_indices = [i for i in sorted(produced) if i not in read or values[i]["name"] in output_names]
    model = helper.make_model(
        helper.make_graph(nodes, title, inputs, [info(i) for i in output_indices],
                          value_info=[info(i) for i in sorted(produced - set(output_indices))]),
        opset_imports=[helper.make_opsetid("", 17)] + [helper.make_opsetid(d, 1) for d in sorted(domains)],
        producer_name="byoc", doc_string="the partitioned build (byoc report --onnx): one node per call")
    return model

