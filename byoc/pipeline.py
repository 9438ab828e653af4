"""The build pipeline: a list of named stages, each `stage(module, context) -> module`.

build() (build.py) runs PIPELINE once per program (once, or once per shape bucket) and
hands the final modules to packaging (package.py). The list below IS the order: the
driver loops over it, `byoc build --print-pipeline` prints it, `--dump-after STAGE`
writes the IR after a stage to the work directory (ir/NN_STAGE.ir).

A stage reads the build's settings from the frozen BuildContext and everything earlier
stages decided from the module itself. What is not a function of the IR travels as a
module attribute (TVM keeps its external modules the same way), each set by one stage;
what belongs to one call is an attribute of the call (PlanMemory's storage, the
cuda_graph stage's graph_region):

    output_names         import        the model's output names
    initializers         import        the model's initializers by name, dtype, shape and
                                       checksum (the library's build record: byoc refit)
    partition_report     partition     which backend took what, and every refusal's reason
    artifacts            codegen       each backend's Artifact (sources, symbols, kernels)
    function_summaries   codegen       each backend function's ops (the report's boxes)
    declared_devices     plan_devices  symbol -> FunctionDevices (where it reads and writes)
    host_setup           plan_host     codegen/host_plan.py's HostPlan, the CUDA graph and
                                       device decisions made with it

The stage functions themselves are thin: each calls one pass (transform/), analysis or
codegen entry point, and writes what a person reads into the work directory.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import BuildError, ConfigError
from .ir.module import IRModule
from .progress import BuildProgress

# The IR dumps a build writes for reading (partitioned.ir, final.ir, cuda_graph.ir, ir/*.ir)
# list constants over this many bytes by type and size, not by their data (the weights).
DUMP_DATA_BYTES = 4096


@dataclass(frozen=True)
class BuildContext:
    """What every stage may read and none may change: the config, the device target, the
    work directory and the model source; for a shape bucket its dims and symbol suffix."""
    config: object  # config.BuildConfig
    target: object  # target.Target: the device target ('cpu' or 'cuda -arch=sm_XX')
    workdir: Path
    model: object = None  # what the import stage reads: an IRModule, an ONNX path, bytes or ModelProto
    input_shapes: dict | None = None
    dims: dict | None = None  # the shape bucket's sizes of named dims (None: the config's)
    symbol_suffix: str = ""  # appended to a bucket's function symbols ("_b1"): one library holds all
    weights: object = None  # codegen.host_plan.WeightsBlob the programs of one library share, or None
    progress: BuildProgress = field(default_factory=BuildProgress, compare=False)
    dump_after: frozenset = frozenset()  # stage names whose output IR is written to ir/

    @property
    def cuda(self) -> bool:
        return self.target.kind == "cuda"

    @property
    def model_name(self) -> str:
        """What report.html is titled."""
        if isinstance(self.model, (str, os.PathLike)):
            return Path(self.model).name
        return "IR module" if isinstance(self.model, IRModule) else "ONNX model"

    def virtual_device(self, place: str):
        """The VirtualDevice of a config place (device | host | host-pinned) or pin device
        (cpu | cuda | cpu/host-pinned) in this build: everything is the cpu on the cpu target."""
        from .ir.virtual_device import VirtualDevice
        if not self.cuda:
            if place.startswith("cuda"):
                raise ConfigError(f"devices: {place!r} is not a device of a cpu build; allowed there: cpu")
            return VirtualDevice("cpu")
        return VirtualDevice.parse({"device": "cuda", "host": "cpu", "host-pinned": "cpu/host-pinned"}.get(place, place))

    @functools.cached_property
    def backend_targets(self) -> dict:
        """Backend name -> its Target: the config's options for it, with the config's tuning
        section (profile, tuning_db) where its Target has those attributes (the backend's own
        options win). Each compiles for this build's device target, into its work directory."""
        from .backend import FALLBACK, get_backend
        from .target import TARGET_KINDS, Target
        targets = {}
        for name, options in self.config.backends:
            tuning = {key: str(value).lower() if isinstance(value, bool) else str(value)
                      for key, value in self.config.tuning.items()
                      if value is not None and key in TARGET_KINDS.get(name, {})}
            if "tf32" in TARGET_KINDS.get(name, {}):  # the config's tf32 (a backend's own option wins)
                tuning["tf32"] = str(self.config.tf32).lower()
            options = {**tuning, **(options or {})}
            targets[name] = Target(name, **options) if options else Target(name)
        if FALLBACK not in targets:  # a config that lists no backend: its package registers its target kind
            get_backend(FALLBACK)
            targets[FALLBACK] = Target(FALLBACK)
        for target in targets.values():
            target.device = self.target
            target.workdir = self.workdir
            target.progress = self.progress  # long work in a backend (tuning) says what it is doing
        return targets

    def value_devices(self, mod) -> dict | None:
        """Var -> VirtualDevice of main's values in a cuda build that keeps data on the host
        (pins, host inputs/outputs); None where everything is on the build's device."""
        from .ir.virtual_device import VirtualDevice
        from .transform.plan_devices import device_of_values
        if not self.cuda:
            return None
        cuda = VirtualDevice("cuda")
        declared = mod.attrs["declared_devices"]
        inputs = self.virtual_device(self.config.devices["inputs"])
        outputs = self.virtual_device(self.config.devices["outputs"])
        if inputs == cuda and outputs == cuda and all(device == cuda for d in declared.values()
                                                      for device in (d.result, *d.params)):
            return None
        return device_of_values(mod, self.virtual_device("device"), function_devices=declared, input_devices=inputs)

    def write(self, name: str, text: str):
        """A file for a person to read, in the work directory."""
        (self.workdir / name).write_text(text)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[IRModule | None, BuildContext], IRModule]

    @property
    def summary(self) -> str:
        """The first line of the stage function's docstring (empty where it has none)."""
        lines = (getattr(self.run, "__doc__", None) or "").strip().splitlines()
        return lines[0] if lines else ""


def run_pipeline(context: BuildContext, stages: list | None = None, mod: IRModule | None = None,
                 after: dict | None = None) -> IRModule:
    """Run `stages` (default: PIPELINE as it is now) in order from `mod` (None: the import
    stage reads context.model). `after`: stage name -> callback(module), called with each
    stage's result (the shape-bucket driver records the simplified module this way); the
    context's dump_after stages are written to ir/NN_NAME.ir."""
    stages = PIPELINE if stages is None else stages
    names = {stage.name for stage in stages}
    unknown = set(context.dump_after) - names
    if unknown:
        raise ConfigError(f"--dump-after {', '.join(sorted(unknown))}: no such stage; expected one of "
                          f"{', '.join(stage.name for stage in stages)}")
    if set(after or ()) - names:  # a hook on a stage that is not run would silently never fire
        raise BuildError(f"internal: hooks after {', '.join(sorted(set(after) - names))}, which the pipeline "
                         f"does not run")
    for number, stage in enumerate(stages):
        mod = stage.run(mod, context)
        if not isinstance(mod, IRModule):
            raise BuildError(f"internal: stage {stage.name!r} returned {type(mod).__name__}; expected an IRModule")
        if stage.name in context.dump_after:
            (context.workdir / "ir").mkdir(exist_ok=True)
            context.write(f"ir/{number:02d}_{stage.name}.ir", mod.script(elide_data_over=DUMP_DATA_BYTES))
        if after and stage.name in after:
            after[stage.name](mod)
    return mod


def describe_pipeline(stages: list | None = None) -> str:
    """The stages, numbered, each with what it does: what --print-pipeline prints."""
    stages = PIPELINE if stages is None else stages
    width = max(len(stage.name) for stage in stages)
    return "\n".join(f"{number:2d}  {stage.name:<{width}}  {stage.summary}" for number, stage in enumerate(stages))


def stage_named(name: str, stages: list | None = None) -> int:
    """The position of stage `name` in `stages` (default PIPELINE)."""
    stages = PIPELINE if stages is None else stages
    for number, stage in enumerate(stages):
        if stage.name == name:
            return number
    raise ConfigError(f"no pipeline stage {name!r}; expected one of {', '.join(s.name for s in stages)}")


def lower(model, config="cpu", *, until: str | None = None, start: str | None = None,
          input_shapes: dict | None = None, workdir=None, dims: dict | None = None) -> IRModule:
    """The public door to the stages without packaging: `model` through PIPELINE up to and
    including stage `until` (default: all of it), for `config` (a config name, path, dict
    or BuildConfig). `start`: the first stage to run (default import), `model` then the
    IRModule an earlier lower(..., until=) returned. Files the stages write go to `workdir`
    (when None, a fresh temporary directory that is the caller's to remove). What tests and
    tools use to look at one stage's result."""
    import tempfile

    from .config import BuildConfig, _validate_input_shapes, for_device, load_config
    from .target import resolve_device_target
    cfg = config if isinstance(config, BuildConfig) else load_config(config)
    if dims is not None:  # validated as the config's own dims are
        cfg = load_config(cfg.to_dict(), overrides={"dims": dims})
    if input_shapes is not None:
        input_shapes = _validate_input_shapes("lower()", input_shapes)
    first = 0 if start is None else stage_named(start)
    last = len(PIPELINE) - 1 if until is None else stage_named(until)
    if last < first:
        raise ConfigError(f"lower(): stage {until!r} comes before stage {start!r}; expected until= at or after start=")
    if first and not isinstance(model, IRModule):
        raise ConfigError(f"lower(start={start!r}): expected the IRModule an earlier lower(..., until=) returned, "
                          f"got {type(model).__name__}")
    if workdir is None:
        workdir = tempfile.mkdtemp(prefix="byoc-lower-")
    device = resolve_device_target(cfg.target)
    cfg, notes = for_device(cfg, device)
    context = BuildContext(config=cfg, target=device, workdir=Path(workdir).resolve(),
                           model=model, input_shapes=input_shapes, dims=dims)
    context.workdir.mkdir(parents=True, exist_ok=True)
    for note in notes:
        context.progress.stage(note)
    return run_pipeline(context, PIPELINE[first:last + 1], mod=model if first else None)


from . import stages as _stages  # noqa: E402 - after the classes and the driver the stages' module names

# The build, in order. Each entry's function documents what it does.
PIPELINE = [
    Stage("import", _stages.import_model),
    Stage("simplify", _stages.simplify),
    Stage("shrink_constants", _stages.shrink_constants),
    Stage("check_sizes", _stages.check_sizes),
    Stage("pin_devices", _stages.pin_devices),
    Stage("partition", _stages.partition),
    Stage("codegen", _stages.codegen),
    Stage("mark_extern", _stages.mark_extern),
    Stage("plan_devices", _stages.plan_devices),
    Stage("plan_memory", _stages.plan_memory),
    Stage("cuda_graph", _stages.cuda_graph),
    Stage("plan_host", _stages.plan_host),
]
