"""build(): one model in, one deployable .so out. The whole pipeline, top to bottom:

    import (ONNX -> IRModule)
    simplify: fold_constant, fold_batch_norm, recognize_gelu, simplify_identity_gather, sink_reshapes,
              combine_parallel_matmul, combine_logit_addends, dead_code_elimination,
              convert_to_float16 when asked; then shrink_broadcast_constants
    PinDevices: ops pinned to another device (config devices.pin) become functions of the
                catch-all backend
    partition: each configured backend's patterns in priority order, then the built-in
               backend takes every op left (so every model builds)
    OutlineCompilerFunctions (structurally equal partitions share one global)
    codegen: one call per backend, with its Target current -> Artifacts
    MarkCompilerFunctionsAsExtern
    PlanDevices: device_copy where a value crosses devices (config devices.inputs/outputs),
                 each function's parameters where its lowering declares them
    PlanMemory: every tensor's storage (memory space, offset, size) written on its call
    RewriteCUDAGraph (cuda_graph): the capturable regions, and why the rest is not
    host code: the tensors, the function table and the program table (the calls, their
               operands, the graph regions) for the static model runtime, the weights blob,
               the metadata JSON
    toolchain: build.ninja (one edge per compile unit, one link edge), object cache, link

Everything generated is kept in the work directory (the config's `workdir`, or a fresh
temporary one): sources, build.ninja, the partition report, weights, and the IR after each
stage (partitioned.ir, final.ir with storage, cuda_graph.ir and cuda_graph.txt).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import BuildError, ByocWarning, CompileError, ConfigError, ModelError
from .ir.module import IRModule
from .library import Library, file_state
from .progress import BuildProgress

# The IR dumps a build writes for reading (partitioned.ir, final.ir, cuda_graph.ir) list
# constants over this many bytes by type and size, not by their data (the weights).
DUMP_DATA_BYTES = 4096


def build(model, target=None, config=None, *, input_shapes: dict | None = None, workdir=None,
          params: str | None = None, precision: str | None = None, dims: dict | None = None) -> Library:
    """Build `model` (an IRModule, an ONNX path/bytes/ModelProto) into a shared library.

    `config` is a build config (a name from build_configs/, a YAML path or a dict;
    default "default"); `target`, `workdir`, `params`, `precision` and `dims` (sizes of
    named dims, e.g. {"batch": 1}) override its keys.
    """
    from .config import _validate_input_shapes, load_config
    overrides = {key: value for key, value in (("target", target), ("workdir", workdir), ("params", params),
                                                ("precision", precision), ("dims", dims)) if value is not None}
    cfg = load_config(config if config is not None else "default", overrides=overrides)
    if input_shapes is not None:  # it replaces the config's input_shapes: check it the same way
        input_shapes = _validate_input_shapes("build()", input_shapes)
    return _Builder(cfg).build(model, input_shapes)


class _Builder:
    def __init__(self, cfg):
        from .target import Target, auto_device_target
        self.cfg = cfg
        device = cfg.target
        self.target = auto_device_target() if device in (None, "auto") else Target(device)
        if self.target.kind not in ("cpu", "cuda"):
            raise ConfigError(f"target: {self.target} is not a device target; expected 'cpu', 'cuda -arch=sm_XX' or 'auto'")
        self.cuda = self.target.kind == "cuda"
        # Absolute: ninja runs in the work directory, so relative paths in its commands would break.
        try:
            self.workdir = Path(cfg.workdir).resolve() if cfg.workdir else Path(tempfile.mkdtemp(prefix="byoc-build-"))
        except (OSError, ValueError, RuntimeError) as error:  # a NUL byte, a symlink loop, no temporary directory
            raise ConfigError(f"workdir {str(cfg.workdir or tempfile.gettempdir())!r} is not a usable directory "
                              f"path: {error}") from None
        # A temporary directory is byoc's own: removed again when the build fails.
        self.temporary = not cfg.workdir
        try:
            try:
                if self.workdir.exists() and not self.workdir.is_dir():
                    raise ConfigError(f"workdir {self.workdir} is not a directory; expected a directory "
                                      f"(it is created when missing)")
                self.workdir.mkdir(parents=True, exist_ok=True)
            except OSError as error:  # a parent is a file, no permission, a name too long
                raise ConfigError(f"workdir {self.workdir} cannot be created: {error.strerror or error}") from None
            self.check_writable()
        except BaseException:
            self.remove_temporary_workdir()
            raise

    def check_writable(self):
        """A ConfigError now, rather than a PermissionError from the first file written
        halfway through the build."""
        try:
            handle, probe = tempfile.mkstemp(prefix=".byoc-write-probe-", dir=self.workdir)
            os.close(handle)
            os.unlink(probe)
        except OSError as error:
            raise ConfigError(f"workdir {self.workdir} is not writable ({error.strerror or error}); expected a "
                              f"directory byoc can write its sources, build.ninja and the library into") from None

    def remove_temporary_workdir(self):
        if self.temporary:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @contextlib.contextmanager
    def workdir_lock(self):
        """Held for the whole build: two builds writing one workdir would overwrite each
        other's sources, objects and model.so. Not waited for: the second build fails."""
        import fcntl
        path = self.workdir / ".byoc.lock"
        try:
            lock = open(path, "a")
        except OSError as error:
            raise ConfigError(f"workdir {self.workdir}: cannot open its lock file {path.name} "
                              f"({error.strerror or error})") from None
        with lock:  # closing the file releases the lock
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise BuildError(f"workdir {self.workdir} is in use by another build; expected one build at a "
                                 f"time per workdir: wait for it to finish, or give this build its own "
                                 f"workdir") from None
            except OSError as error:  # a file system without locks: build unlocked, but say so
                import warnings
                warnings.warn(f"workdir {self.workdir}: cannot lock {path.name} ({error.strerror or error}); "
                              f"building without protection against a concurrent build into it", ByocWarning,
                              stacklevel=4)
            yield

    # ---- the pipeline ----------------------------------------------------------------
    def build(self, model, input_shapes) -> Library:
        started = time.perf_counter()
        self.progress = BuildProgress()
        what = Path(model).name if isinstance(model, (str, os.PathLike)) else "the model"
        self.progress.stage(f"building {what} for {self.target} (backends: "
                            f"{', '.join(self.cfg.backend_names) or 'builtin'}; workdir {self.workdir})")
        try:
            with self.workdir_lock(), self.progress.heartbeat():
                library = self.link(self.lower_programs(model, input_shapes))
                library.build_stats["seconds"] = round(time.perf_counter() - started, 2)
                (self.workdir / "build_stats.json").write_text(json.dumps(library.build_stats, indent=2,
                                                                          sort_keys=True))
            if self.temporary:
                library.workdir_kept = False
                # byoc's own directory goes with the Library (at the latest when the process
                # exits): a Module loaded from it keeps its mapping and weights, and
                # export_library() copies the files out first. workdir= keeps the sources.
                import weakref
                weakref.finalize(library, shutil.rmtree, str(self.workdir), True)
        except CompileError:
            raise  # a compiler or link error points into the workdir (its sources, its rerun command): keep it
        except BaseException:
            self.remove_temporary_workdir()
            raise
        return library

    def lower_programs(self, model, input_shapes) -> list:
        """The library's programs, lowered and host-planned: one for a static build; with
        several sizes for a named dim (config dims: {batch: [1, 8, 32]}), one per shape
        bucket, each lowered on its own (sources in bucket<N>/ of the work directory, its
        function symbols ending in _b<N>) with the constants of all in one weights blob."""
        from .codegen.host import WeightsBlob
        buckets = self.cfg.shape_buckets()
        if len(buckets) == 1:
            self.dims = buckets[0]
            mod, output_names, artifacts, report = self.lower(model, input_shapes)
            return [_Program(self, buckets[0], mod, artifacts, report, self.plan_host(mod, artifacts, output_names))]
        if isinstance(model, IRModule):
            raise ConfigError(f"dims {self.cfg.dims}: shape buckets are for ONNX models (their named dims); "
                              f"an IRModule has static shapes already")
        import dataclasses
        weights = WeightsBlob(share_equal=True)
        pairs = self.padding_pairs(buckets)
        compared = {index for pair in pairs.values() for index in pair}
        programs = []
        self.model_name = Path(model).name if isinstance(model, (str, os.PathLike)) else "ONNX model"
        source = model
        for number, dims in enumerate(buckets):
            label = ", ".join(f"{name}={size}" for name, size in dims.items())
            self.progress.stage(f"shape bucket {number + 1}/{len(buckets)}: {label}")
            bucket = _Builder(dataclasses.replace(self.cfg, workdir=str(self.workdir / f"bucket{number}"), dims=dims))
            bucket.progress, bucket.dims, bucket.symbol_suffix = self.progress, dims, f"_b{number}" if number else ""
            mod, output_names, artifacts, report = bucket.lower(source, input_shapes)
            if number == 0 and isinstance(model, (str, os.PathLike)):
                # the file once more, for all the other buckets: their weights view these bytes
                # (the first bucket's import named the file in any error, and read it whole)
                source = Path(model).read_bytes()
            host = bucket.plan_host(mod, artifacts, output_names, weights)
            programs.append(_Program(bucket, dims, mod, artifacts, report, host))
            if number not in compared:
                bucket.simplified = None
        from .analysis.padding import padding_problem
        self.padding = {}
        for name, (small, large) in pairs.items():
            try:
                self.padding[name] = padding_problem(
                    programs[small].builder.simplified, programs[large].builder.simplified,
                    [output for output, _ in programs[large].host.plan.outputs])
            except Exception as error:  # noqa: BLE001 - an analysis the build does not need: say so, build on
                self.padding[name] = f"the analysis failed ({type(error).__name__}: {error})"
        for program in programs:
            program.builder.simplified = None
        # the axes the runtime pads (a dim whose axes do not scale with it is refused here)
        from .analysis.padding import padded_axes
        axes, self.padding = padded_axes(
            buckets, [[(name, tuple(type_.shape)) for name, type_ in program.host.plan.inputs + program.host.plan.outputs]
                      for program in programs], self.padding)
        self.padded_dims = sorted(name for name, problem in self.padding.items() if problem is None)
        for program, program_axes in zip(programs, axes):
            program.axis_dims = program_axes
        shapes = {}
        for program in programs:  # a dim no input declares (input_shapes fixed it): buckets run alike
            key = tuple((name, tuple(type_.shape)) for name, type_ in program.host.plan.inputs)
            if key in shapes:
                raise ConfigError(f"dims {self.cfg.dims}: buckets {shapes[key]} and {program.dims} take inputs of "
                                  f"the same shapes ({', '.join(f'{n} {s}' for n, s in key)}); expected sizes of "
                                  f"dims the inputs declare (input_shapes fixes an input's dims)")
            shapes[key] = program.dims
        return programs

    def padding_pairs(self, buckets: list) -> dict:
        """For each dim given several sizes: the two buckets (indices) that differ only in it,
        at its two largest sizes, the other dims at their largest too (where a size of 1 would
        hide a reshape that interleaves rows), whose programs analysis/padding.py compares."""
        pairs = {}
        for name, sizes in self.cfg.dims.items():
            if isinstance(sizes, list) and len(sizes) > 1:
                smaller, larger = sorted(sizes)[-2:]
                base = dict(buckets[-1])
                pairs[name] = (buckets.index({**base, name: smaller}), buckets.index({**base, name: larger}))
        return pairs

    def lower(self, model, input_shapes):
        """Every IR stage, up to the final main (written to final.ir); no compiler runs
        (backends only write their sources)."""
        progress = getattr(self, "progress", None) or BuildProgress()
        mod, output_names = self.import_model(model, input_shapes)
        progress.stage(f"imported: {len(mod['main'].bindings)} ops")
        mod = self.simplify(mod)
        self.simplified = mod  # what lower_programs compares between shape buckets (analysis/padding.py)
        # after that record: a constant shrunk in one bucket's program and not in another's
        # would look like the start of the other's to the padding analysis
        from .transform import dead_code_elimination, shrink_broadcast_constants
        mod = dead_code_elimination(shrink_broadcast_constants(mod))
        progress.stage(f"simplified: {len(mod['main'].bindings)} ops")
        # while main still binds every tensor (partitioning hides some inside functions), and
        # before any backend writes a size into C++
        from .codegen.host import check_tensor_sizes
        check_tensor_sizes(mod["main"])
        mod = self.pin_devices(mod)
        mod, report = self.partition(mod)
        progress.stage(f"partitioned: {len(mod.functions) - 1} functions for "
                       f"{', '.join(self.cfg.backend_names)} (report in {self.workdir / 'partition_report.txt'})")
        mod, artifacts = self.codegen(mod)
        progress.stage(f"code generated: {len(artifacts)} artifacts (sources in {self.workdir})")
        from .report_page import describe_functions
        self.function_summaries = describe_functions(
            mod, {s: k for a in artifacts for s, k in a.kernels.items()})
        # Pinned functions lose their Device attribute as they become extern: keep it here.
        self.pinned = {name: f.attrs["Device"] for name, f in mod.items() if "Device" in f.attrs}
        from .transform.mark_compiler_functions_as_extern import mark_compiler_functions_as_extern
        mod = mark_compiler_functions_as_extern(mod)
        mod = self.plan_devices(mod, artifacts)
        mod = self.plan_memory(mod, artifacts)
        (self.workdir / "final.ir").write_text(mod.script(elide_data_over=DUMP_DATA_BYTES))
        return mod, output_names, artifacts, report

    def import_model(self, model, input_shapes):
        # what report.html is titled
        self.model_name = Path(model).name if isinstance(model, (str, os.PathLike)) else \
            ("IR module" if isinstance(model, IRModule) else "ONNX model")
        if isinstance(model, IRModule):
            check_module(model)
            mod = model
        else:
            from .frontend.onnx import from_onnx
            # the shape bucket's dims (lower_programs), else the config's
            dims = getattr(self, "dims", None)
            mod = from_onnx(model, input_shapes or self.cfg.input_shapes or None,
                            (self.cfg.dims if dims is None else dims) or None)
        output_names = mod.attrs.get("output_names")
        return mod, output_names

    def simplify(self, mod):
        from .transform import convert_to_float16, dead_code_elimination, fold_constant, simplify_identity_gather
        from .transform.recognize_gelu import recognize_gelu
        from .transform.fold_batch_norm import fold_batch_norm
        from .transform.sink_reshapes import sink_reshapes
        from .transform.combine_parallel_matmul import combine_parallel_matmul
        from .transform.combine_logit_addends import combine_logit_addends
        from .frontend.onnx import MAX_FOLDED_BYTES
        # the importer's folding limit: a constant larger than that (an Expand to 2**40
        # elements) stays an op rather than being allocated here, and the size checks decide
        def fold(mod):
            return fold_constant(mod, size_limit_bytes=MAX_FOLDED_BYTES)
        mod = dead_code_elimination(recognize_gelu(dead_code_elimination(fold_batch_norm(fold(mod)))))
        # after FoldConstant (the indices are constants then), before SinkReshapes (which
        # merges the reshape it leaves with its neighbours); after RecognizeGelu: a GEMM's
        # activation reads its reshape only once recognized
        mod = dead_code_elimination(fold(sink_reshapes(simplify_identity_gather(mod))))
        # after FoldConstant: weights and biases are constants only once their preprocessing folds
        mod = dead_code_elimination(combine_logit_addends(combine_parallel_matmul(mod)))
        if self.cfg.precision in ("float16", "bfloat16"):
            mod = dead_code_elimination(fold(convert_to_float16(
                mod, dtype=self.cfg.precision, keep_float32_ops=self.keep_float32_ops())))
        return mod

    def keep_float32_ops(self) -> frozenset:
        """The precision pass's float32 ops, less those that every backend able to take
        them computes with float32 statistics internally (the built-in backend takes any
        op; the others, the ops their patterns name)."""
        from .backend import FALLBACK, get_backend
        from .pattern import ops_named
        from .transform.convert_to_float16 import DEFAULT_KEEP_FLOAT32_OPS
        backends = [get_backend(name) for name in self.cfg.backend_order]
        keep = set(DEFAULT_KEEP_FLOAT32_OPS)
        for op_name in DEFAULT_KEEP_FLOAT32_OPS:
            takers = [b for b in backends if b.name == FALLBACK
                      or any(op_name in ops_named(entry.pattern) for entry in b.patterns)]
            if takers and all(op_name in b.float32_statistics for b in takers):
                keep.discard(op_name)
        return frozenset(keep)

    # ---- devices ---------------------------------------------------------------------------
    def virtual_device(self, place: str):
        """The VirtualDevice of a config place (device | host | host-pinned) or pin device
        (cpu | cuda | cpu/host-pinned) in this build: everything is the cpu on the cpu target."""
        from .ir.virtual_device import VirtualDevice
        if not self.cuda:
            if place.startswith("cuda"):
                raise ConfigError(f"devices: {place!r} is not a device of a cpu build; allowed there: cpu")
            return VirtualDevice("cpu")
        return VirtualDevice.parse({"device": "cuda", "host": "cpu", "host-pinned": "cpu/host-pinned"}.get(place, place))

    def pin_devices(self, mod):
        from .transform.pin_devices import pin_devices
        pins = [{**pin, "device": str(self.virtual_device(pin["device"]))} for pin in self.cfg.devices["pin"]]
        return pin_devices(mod, pins, self.virtual_device("device"))

    def function_devices(self, mod, artifacts) -> dict:
        """Extern symbol -> FunctionDevices (where it reads each parameter and writes its
        result): a pinned function's own device for all of them; else what the lowered
        function declares (its artifact's `devices`, per parameter: memory scopes flow out
        of lowering); else its backend's device for all. A cpu build keeps everything on
        the cpu."""
        from .backend import get_backend
        from .ir.virtual_device import VirtualDevice
        from .transform.plan_devices import FunctionDevices
        devices = {}
        for artifact in artifacts:
            backend_device = get_backend(artifact.backend).virtual_device(self.target.kind)
            for symbol in artifact.symbols:
                pinned = self.pinned.get(symbol)
                num_params = len(mod[symbol].params) if symbol in mod else 0
                if pinned and self.cuda:
                    devices[symbol] = FunctionDevices.on(VirtualDevice.parse(pinned), num_params)
                elif symbol in artifact.devices and self.cuda:
                    devices[symbol] = self.declared_by_lowering(artifact, symbol, num_params)
                else:
                    devices[symbol] = FunctionDevices.on(backend_device, num_params)
        return devices

    @staticmethod
    def declared_by_lowering(artifact, symbol: str, num_params: int):
        """An artifact's FunctionDevices for `symbol`, checked: one device per parameter."""
        from .transform.plan_devices import FunctionDevices
        declared = artifact.devices[symbol]
        if not isinstance(declared, FunctionDevices) or len(declared.params) != num_params:
            raise BuildError(f"backend {artifact.backend!r} declares the devices of @{symbol} as {declared!r}; "
                             f"expected a FunctionDevices with one device for each of its {num_params} "
                             f"parameter(s)")
        return declared

    def has_host_data(self, mod) -> bool:
        """Whether a cuda build keeps any data off the GPU (then the host code needs the
        device-aware plan: host arenas, copies, synchronization)."""
        from .ir.virtual_device import VirtualDevice
        cuda = VirtualDevice("cuda")
        return (self.input_device != cuda or self.output_device != cuda
                or any(device != cuda for declared in self.declared_devices.values()
                       for device in (declared.result, *declared.params)))

    def plan_devices(self, mod, artifacts):
        from .transform.plan_devices import plan_devices
        self.declared_devices = self.function_devices(mod, artifacts)
        # where each function runs: where it writes its result
        self.devices = {symbol: declared.result for symbol, declared in self.declared_devices.items()}
        self.input_device = self.virtual_device(self.cfg.devices["inputs"])
        self.output_device = self.virtual_device(self.cfg.devices["outputs"])
        return plan_devices(mod, self.virtual_device("device"), function_devices=self.declared_devices,
                            input_devices=self.input_device, output_devices=self.output_device)

    def value_devices(self, mod) -> dict | None:
        """Var -> VirtualDevice of main's values in a cuda build that keeps data on the
        host (pins, host inputs/outputs); None where everything is on the build's device."""
        if not (self.cuda and self.has_host_data(mod)):
            return None
        from .transform.plan_devices import device_of_values
        return device_of_values(mod, self.virtual_device("device"), function_devices=self.declared_devices,
                                input_devices=self.input_device)

    def plan_memory(self, mod, artifacts):
        """PlanMemory: every tensor's storage written into main. CUDA graphs that copy the
        caller's tensors (cuda_graph_io: copy) need every output computed into the arena."""
        from .transform.plan_memory import plan_memory
        graphs_copy_outputs = self.cuda and self.cfg.cuda_graph and self.cfg.cuda_graph_io == "copy"
        return plan_memory(mod, devices=self.value_devices(mod), default_device=self.virtual_device("device"),
                           views={s for artifact in artifacts for s in artifact.view_symbols},
                           outputs_in_place=not graphs_copy_outputs)

    def partition(self, mod):
        from .backend import FALLBACK, get_backend
        from .transform.partition import partition_for
        names = [name for name in self.cfg.backend_names if name != FALLBACK]
        backends = [get_backend(name) for name in names]  # an unknown backend fails here, with the known ones
        targets = self.backend_targets() if any(b.pre_partition for b in backends) else {}
        for backend in backends:  # what each backend needs before any patterns look (cutlass: NHWC convs)
            if backend.pre_partition is not None:
                mod = backend.pre_partition(mod, targets[backend.name], "cuda" if self.cuda else "cpu")
        # Slices instead of splits before any backend looks: patterns see one op per piece.
        from .transform.lower_split import lower_split
        mod, report = partition_for(lower_split(mod), names, finalize=get_backend(FALLBACK).takes_the_rest,
                                    symbol_suffix=getattr(self, "symbol_suffix", ""))
        (self.workdir / "partition_report.json").write_text(json.dumps(report.to_json(), indent=2, sort_keys=True))
        (self.workdir / "partition_report.txt").write_text(report.to_text())
        (self.workdir / "partitioned.ir").write_text(mod.script(elide_data_over=DUMP_DATA_BYTES))
        return mod, report

    def codegen(self, mod):
        from .transform.run_codegen import run_codegen
        targets = self.backend_targets()
        return run_codegen(mod, targets)

    def backend_targets(self) -> dict:
        from .backend import FALLBACK
        from .target import TARGET_KINDS, Target
        targets = {}
        for name, options in self.cfg.backends:
            # The config's tuning section (profile, tuning_db) reaches every backend whose
            # Target has those attributes; the backend's own options win.
            tuning = {key: str(value).lower() if isinstance(value, bool) else str(value)
                      for key, value in self.cfg.tuning.items()
                      if value is not None and key in TARGET_KINDS.get(name, {})}
            options = {**tuning, **(options or {})}
            targets[name] = Target(name, **options) if options else Target(name)
        targets.setdefault(FALLBACK, Target(FALLBACK))
        for target in targets.values():
            target.device = self.target  # backends compile for this device target
            target.workdir = self.workdir  # and write their sources here
        return targets

    def plan_cuda_graph(self, mod, artifacts) -> list:
        """RewriteCUDAGraph's regions of main (binding indices): runs of calls that a CUDA
        graph may capture, i.e. calls of a capturable backend's functions that run on the
        GPU on storage PlanMemory made static; a cpu function or a copy between memories
        runs between two regions. The rewritten module is written to the work directory
        (cuda_graph.ir), and why each other call is not captured to cuda_graph.txt."""
        from .backend import get_backend
        from .transform.rewrite_cuda_graph import rewrite_cuda_graph, scan_regions
        backend_of = {symbol: artifact.backend for artifact in artifacts for symbol in artifact.symbols}
        devices = getattr(self, "devices", {})

        def capturable(symbol):
            if symbol in devices and devices[symbol].device_type != "cuda":
                return f"@{symbol} runs on the {devices[symbol].device_type}"
            backend = backend_of[symbol]
            return True if get_backend(backend).capturable else f"backend {backend!r} declares its functions not capturable"

        regions, breaks = scan_regions(mod, capturable)
        (self.workdir / "cuda_graph.ir").write_text(rewrite_cuda_graph(mod, regions=regions).script(
            elide_data_over=DUMP_DATA_BYTES))
        lines = [f"{len(regions)} CUDA graph region(s): " + ", ".join(f"{len(r)} calls" for r in regions),
                 "Calls run between regions (not captured), and why:"]
        lines += [f"  binding {index}: {reason}" for index, reason in breaks]
        (self.workdir / "cuda_graph.txt").write_text("\n".join(lines) + "\n")
        return regions

    # ---- host code and the toolchain ------------------------------------------------------
    @staticmethod
    def compile_stats(compiled: dict, unit_backends: list) -> dict:
        """Compile units per backend (a backend's units are its unique functions: equal
        partitions share one) and how many of them the compiler ran for (the rest came
        from the object cache); host code and weights count as "host"."""
        per_backend = {}
        compiled_units = set(compiled.get("compiled", ()))
        for index in range(compiled.get("units", 0)):
            backend = unit_backends[index] if index < len(unit_backends) else "host"
            entry = per_backend.setdefault(backend, {"units": 0, "compiled": 0})
            entry["units"] += 1
            entry["compiled"] += index in compiled_units
        total_compiled = len(compiled.get("compiled", ()))
        slowest = sorted(compiled.get("unit_seconds", {}).items(), key=lambda item: -item[1])[:5]
        return {"compile_units": compiled.get("units", 0), "compiled": total_compiled,
                "cached": compiled.get("units", 0) - total_compiled,
                "compile_seconds": compiled.get("compile_seconds", 0.0), "backends": per_backend,
                "slowest_units": [{"source": name, "seconds": seconds} for name, seconds in slowest]}

    def link(self, programs: list) -> Library:
        """The back end's last steps: write the host tables and the embedded files of the
        programs (lower_programs), compile every unit and link the library."""
        first = programs[0]
        weights = first.host.plan.weights if len(programs) == 1 else bytes(first.host.weights_blob.data)
        units, unit_backends = self.program_units(programs)
        link_libraries = []
        for program in programs:
            for artifact in program.artifacts:
                link_libraries += [library for library in artifact.link_libraries if library not in link_libraries]
        from concurrent.futures import ThreadPoolExecutor

        from .codegen.host import blob_checksum
        with ThreadPoolExecutor(max_workers=1) as pool:
            # The runtime's checksum of the weights and their sha256 are two passes over them
            # (220 MB for a BERT-base): NumPy and hashlib let go of the GIL, so they overlap.
            weights_checksum = pool.submit(blob_checksum, weights)
            content = hashlib.sha256()
            content.update(str(self.target).encode())
            for unit in units:
                content.update(Path(unit.source).read_bytes())
            weights_digest = hashlib.sha256(weights).hexdigest()  # once: it keys the weights' object too
            content.update(weights_digest.encode())
            weights_checksum = weights_checksum.result()
        build_id = content.hexdigest()[:16]
        metadata = first.builder.metadata(first.mod, first.host, first.artifacts, build_id, first.report,
                                          weights_bytes=len(weights))
        if len(programs) > 1:
            metadata = self.with_variants(metadata, programs)
        tables = [self.program_table(program.host, program.artifacts) for program in programs]
        units += self.host_units(programs, build_id, tables, weights, weights_checksum)
        embedded_units, sidecar = self.embedded_units(weights, metadata, build_id, tables, weights_digest)
        units += embedded_units
        output, compiled = self.compile_and_link(units, link_libraries, build_id)
        plan = first.host.plan
        library = Library(path=output, workdir=self.workdir, metadata=json.loads(metadata), report=first.report,
                          sidecar=sidecar, memory=plan.memory_plan.summary() if plan.memory_plan else {},
                          build_stats=self.compile_stats(compiled, unit_backends),
                          file_states={str(path): file_state(path) for path in (output, sidecar) if path})
        (self.workdir / "metadata.json").write_text(json.dumps(library.metadata, indent=2, sort_keys=True))
        from .report_page import render_page
        (self.workdir / "report.html").write_text(render_page(library.metadata,
                                                                  title=getattr(self, "model_name", "model")))
        return library

    @staticmethod
    def program_units(programs: list) -> tuple:
        """Every program's compile units, each object once: a unit of a later program that
        writes the same object from the same text, flags and dependencies as one before (a
        CUTLASS kernel unit: named by a hash of its types) is that one; a source the bucket
        generated (in its own bucket<N>/, its symbols ending _b<N>) that would write an
        object of the same name is renamed b<N>_<name>. Any other such pair (a library source
        compiled two ways) would define its symbols twice: a BuildError. Returns (units, the
        backend of each)."""
        units, unit_backends, written = [], [], {}
        for number, program in enumerate(programs):
            for artifact in program.artifacts:
                for unit in artifact.compile_units:
                    same = written.get(unit.output)
                    if same is not None:
                        if (same.language, list(same.flags), list(map(str, same.dependencies))) == \
                                (unit.language, list(unit.flags), list(map(str, unit.dependencies))) and \
                                Path(same.source).read_bytes() == Path(unit.source).read_bytes():
                            continue
                        generated = Path(unit.source).resolve().is_relative_to(program.builder.workdir.resolve())
                        if not generated or unit.language == "cubin":  # a cubin's name is its symbol's
                            raise BuildError(
                                f"shape buckets {programs[0].dims} and {program.dims} need {unit.output} "
                                f"({unit.source}) compiled two ways (flags or text differ); one library cannot "
                                f"hold both: build these buckets as separate libraries")
                        import dataclasses
                        unit = dataclasses.replace(unit, output=f"b{number}_{unit.output}")
                    written[unit.output] = unit
                    units.append(unit)
                    unit_backends.append(artifact.backend)
        return units, unit_backends

    def with_variants(self, metadata: str, programs: list) -> str:
        """The metadata of a library with shape buckets: the first bucket's tensors at the top
        (as a static library's), and `variants`: each bucket's dims, tensors and memory."""
        data = json.loads(metadata)
        variants = []
        for program in programs:
            plan = program.host.plan

            def tensors(entries, top, axis_dims):  # where a tensor lives is the same in every bucket
                return [{**place, "name": name, "shape": list(type_.shape), "dtype": type_.dtype,
                         # the axes run() pads: the paddable dim each carries
                         **({"axis_dims": axes} if any(axes) else {})}
                        for (name, type_), place, axes in zip(entries, top, axis_dims)]
            axis_dims = program.axis_dims or [[None] * len(t.shape) for _, t in plan.inputs + plan.outputs]
            variants.append({"dims": program.dims,
                             "inputs": tensors(plan.inputs, data["inputs"], axis_dims[:len(plan.inputs)]),
                             "outputs": tensors(plan.outputs, data["outputs"], axis_dims[len(plan.inputs):]),
                             "memory": {"arena_bytes": plan.arena_bytes, "workspace_bytes": plan.workspace_bytes,
                                        **({"plan": plan.memory_plan.summary()} if plan.memory_plan else {})}})
        data["variants"] = variants
        padding = getattr(self, "padding", None) or {}
        # whether sizes between the buckets run padded into the next one (then run() takes any
        # size from 1 to the largest), and why not
        data["dims"] = {name: {"sizes": sorted(sizes) if isinstance(sizes, list) else [sizes],
                               **({"paddable": padding[name] is None} if name in padding else {}),
                               **({"range": [1, max(sizes)]} if name in padding and padding[name] is None else {}),
                               **({"why_not": padding[name]} if padding.get(name) else {})}
                        for name, sizes in self.cfg.dims.items()}
        for key in ("arena_bytes", "workspace_bytes"):  # the memories are shared, as large as the largest needs
            data["memory"][key] = max(variant["memory"][key] for variant in variants)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def plan_host(self, mod, artifacts, output_names, weights=None) -> "_HostSetup":
        """Where every tensor lives (codegen/host.py: plan_host, from PlanMemory's storage),
        whether the calls run as CUDA graphs and how they take the caller's tensors, and
        which values PlanDevices put on the host."""
        from .codegen.host import plan_host
        workspace = {}
        for artifact in artifacts:
            workspace.update(artifact.workspace_bytes)
        regions = self.plan_cuda_graph(mod, artifacts) if self.cfg.cuda_graph and self.cuda else []
        cuda_graph = bool(regions)
        value_devices = self.value_devices(mod)
        view_symbols = {s for artifact in artifacts for s in artifact.view_symbols}
        graph_io = self.cfg.cuda_graph_io if cuda_graph else None
        plan = plan_host(mod, workspace, output_names=output_names, static_io=graph_io == "copy",
                         device=str(self.virtual_device("device")), view_symbols=view_symbols,
                         graph_regions=regions, value_devices=value_devices,
                         function_devices=self.declared_devices if value_devices is not None else None,
                         weights=weights)
        return _HostSetup(plan, cuda_graph, graph_io, value_devices is not None, view_symbols, weights)

    def metadata(self, mod, host: "_HostSetup", artifacts, build_id: str, report, weights_bytes: int | None = None) -> str:
        """The library's metadata JSON (codegen/host.py: metadata_json)."""
        from .codegen.host import metadata_json
        from .report_page import execution_graph
        plan = host.plan
        backend_of = {symbol: artifact.backend for artifact in artifacts for symbol in artifact.symbols}
        functions = [{"symbol": s, "backend": backend_of.get(s, "?"),
                      "calls": sum(1 for c in plan.calls if c["symbol"] == s)} for s in plan.extern_symbols]
        graph = execution_graph(mod, plan.memory_plan, getattr(self, "function_summaries", None),
                                views=host.view_symbols)
        return metadata_json(plan, build_id=build_id, target=str(self.target), weights_bytes=weights_bytes,
                             arch=self.target.attrs.get("arch") if self.cuda else None,
                             backends=sorted({f["backend"] for f in functions}), functions=functions,
                             weights_location="sidecar" if self.cfg.params == "sidecar" else "embedded",
                             cuda_graph=host.cuda_graph,
                             partition_report=report.to_json() if report is not None else None, graph=graph)

    @staticmethod
    def program_table(host: "_HostSetup", artifacts) -> bytes:
        """The calls, regions and caller copies as the runtime's binary program table."""
        from .codegen.host import program_table
        return program_table(host.plan, [s for a in artifacts for s in a.stateful_symbols])

    def host_units(self, programs: list, build_id: str, tables: list, weights: bytes, weights_checksum: int) -> list:
        """host.cc (the model's tables: a variant per program, `tables` their program tables)
        and the static model runtime they drive, which is compiled once per flavor (and
        flags) into the object cache."""
        from .codegen.host import HostVariant, render_host
        from .runtime import C_ABI_HEADER, model_runtime_sources
        from .toolchain import CompileUnit
        variants = [HostVariant(program.host.plan, table, program_symbol=_program_symbol(number),
                                stateful=[s for a in program.artifacts for s in a.stateful_symbols],
                                cuda_graph=program.host.cuda_graph, graph_io=program.host.graph_io,
                                devices=program.host.devices,
                                description=", ".join(f"{name}={size}" for name, size in program.dims.items()),
                                axis_dims=program.axis_dims, dims=program.dims)
                    for number, (program, table) in enumerate(zip(programs, tables))]
        host_source = render_host(variants, cuda=self.cuda, build_id=build_id,
                                  padded_dims=getattr(self, "padded_dims", None) or [],
                                  arch_number=self.target.arch_number() if self.cuda else None,
                                  weights_embedded=self.cfg.params != "sidecar", weights_bytes=len(weights),
                                  weights_checksum=weights_checksum)
        host_path = self.workdir / "host.cc"
        host_path.write_text(host_source)
        host_flags = self.target.cxx_flags() + [f"-I{C_ABI_HEADER.parent}"]
        if self.cuda:
            from .toolchain.compiler import cuda_include_dirs
            host_flags += [f"-I{d}" for d in cuda_include_dirs()]
        runtime_flags = host_flags + [f"-DBYOC_RUNTIME_CUDA={int(self.cuda)}"]
        return [CompileUnit(source=host_path, language="cxx", flags=host_flags, output="host.o")] + \
            [CompileUnit(source=source, language="cxx", flags=runtime_flags, output=f"{source.stem}.o")
             for source in model_runtime_sources(self.cuda)]

    def embedded_units(self, weights: bytes, metadata: str, build_id: str, tables: list,
                       weights_digest: str = "") -> tuple:
        """The weights (embedded, or a .safetensors sidecar), the metadata JSON and the program table, each
        embedded by an assembler file with .incbin: a C array of them would compile for
        seconds (BERT-base's weights, its partition report and execution graph). Returns
        (the compile units, the sidecar's path or None)."""
        from .codegen.host import render_blob_assembly, write_safetensors
        from .toolchain import CompileUnit
        files = [(self.workdir / "metadata.bin", "byoc_metadata_json", "The metadata JSON", metadata.encode("utf-8"))]
        files += [(self.workdir / f"program{number or ''}.bin", _program_symbol(number),
                   "A program table (byoc/runtime/model_program.cc)", table) for number, table in enumerate(tables)]
        sidecar = None
        if self.cfg.params == "sidecar":
            sidecar = self.workdir / "model.safetensors"
            write_safetensors(sidecar, weights, build_id)
        else:
            files.insert(0, (self.workdir / "weights.bin", "byoc_weights_blob", "The model's weights", weights))
        units = []
        for path, symbol, what, data in files:
            path.write_bytes(data)
            assembly = path.with_suffix(".S")
            # .incbin finds the file through the assembler's include path, so the source
            # (and its cache key) does not depend on where the build happens.
            assembly.write_text(render_blob_assembly(path.name, symbol, what))
            units.append(CompileUnit(source=assembly, language="asm", flags=[f"-Wa,-I,{self.workdir}"],
                                     output=f"{path.stem}.o", dependencies=[path],
                                     dependencies_digest=weights_digest if data is weights else ""))
        return units, sidecar

    def compile_and_link(self, units: list, link_libraries: list, build_id: str = "") -> tuple:
        """Every unit through ninja and the object cache, then the sealed model.so, which
        exports only the C ABI. Returns (its path, the compile statistics). The library's
        ELF build-id is `build_id` (hex), not a hash the linker computes over the whole file:
        with the weights embedded that hash was half of ld's time (0.2 of 0.37 s here)."""
        from .runtime import seal_library
        from .toolchain import compile_units, link_shared
        compiled = {}
        progress = getattr(self, "progress", None) or BuildProgress()
        progress.stage(f"compiling {len(units)} units (ninja, {self.workdir / 'build.ninja'})")
        objects = compile_units(units, self.workdir, jobs=self.cfg.compile_jobs, stats=compiled,
                                progress=progress.compile_line)
        version_script = self.workdir / "exports.map"
        version_script.write_text("{\n  global: byoc_model_*; byoc_last_error;\n  local: *;\n};\n")
        link_flags = [f"-Wl,--version-script={version_script}", "-Wl,--no-undefined"]
        if build_id:
            link_flags.append(f"-Wl,--build-id=0x{build_id}")
        libraries = list(link_libraries)
        if self.cuda:
            from .toolchain.compiler import cuda_link_flags
            libraries = cuda_link_flags(libraries)
        output = self.workdir / "model.so"
        link_shared(objects, output, link_flags, libraries, workdir=self.workdir)
        seal_library(output)  # load() checks every byte against it before the dynamic loader maps the file
        return output, compiled


def _program_symbol(number: int) -> str:
    """The symbol of program `number`'s table (a static library's one: byoc_program_table)."""
    return f"byoc_program_table{f'_{number}' if number else ''}"


@dataclass
class _Program:
    """One program of the library (lower_programs): the builder that lowered it, the named
    dims of its shape bucket, its final module, artifacts, partition report and host setup."""
    builder: "_Builder"
    dims: dict
    mod: IRModule
    artifacts: list
    report: object
    host: "_HostSetup"
    # per caller tensor (inputs, then outputs), per axis: the paddable dim it carries or None
    axis_dims: list | None = None


@dataclass
class _HostSetup:
    """What the host code is planned from: the HostPlan, and the CUDA graph and device
    decisions made with it."""
    plan: object  # codegen.host.HostPlan
    cuda_graph: bool
    graph_io: str | None
    devices: bool
    view_symbols: set
    weights_blob: object = None  # codegen.host.WeightsBlob: the one the programs of a library share


def check_module(mod: IRModule):
    """A ModelError unless `mod` has what build() runs: a function @main with a body that
    no backend claims (the host code calls it; its calls reach the other globals)."""
    from .ir.printer import format_global_name
    if "main" not in mod:
        names = ", ".join(format_global_name(name) for name in mod.functions) or "no functions"
        raise ModelError(f"the module has no function @main (it has {names}); expected @main, the entry "
                         f"function the built library runs")
    main = mod["main"]
    if main.is_extern:
        raise ModelError("@main is an extern declaration (no body); expected @main to be a function with a "
                         "body: the entry function the built library runs")
    if main.attrs.get("Compiler") is not None:
        raise ModelError(f"@main has Compiler={str(main.attrs['Compiler'])!r}; expected the entry function "
                         f"without a Compiler attribute: give the backend's code a global function of its "
                         f"own and call it from @main")
