"""Build configurations: YAML files (shipped ones in build_configs/) or dicts.

Every key is optional; the values shown are the defaults unless noted.

    target: auto            # the device: auto (cuda for the visible GPU, else cpu) | cpu
                            # | "cuda -arch=sm_90" | {kind: cuda, arch: sm_90}
    arch: []                # cuda: several archs in one library, e.g. [sm_80, sm_90] (a
                            # program per arch; the runtime runs the one the device suits)
    backends: []            # auto: on a GPU the tuned backends this machine can build
                            # (cutlass, cudnn, cublaslt, in that order; one whose package
                            # is missing is left out, and the build says so), on the CPU
                            # builtin alone | a list in priority order: each item a name, or {name: {options}} where
                            # the options are that backend's Target attributes, e.g.
                            #   - cutlass: {sm: 90, use_fast_math: true}
                            #   - cublaslt
                            # builtin takes every op nobody claimed and is always last
                            # (listing it is allowed, but only in the last place)
    partition: priority     # priority: each backend's pattern matches in the order above |
                            # measured: every backend's matches are candidates, each one's
                            # run time measured (or read from the cost store), the cheapest
                            # cover of the model chosen (byoc/costs.py, transform/measured_partition.py)
    precision: float32      # float32 | float16 | bfloat16
    tf32: false             # true: float32 matmuls (cublaslt) and convs (cudnn) may run on TF32
                            # tensor cores, as torch's cuDNN convs and TensorRT do by default
    cuda_graph: false       # true | false: capture static regions into CUDA graphs (true
                            # needs target cuda or auto; auto without a GPU builds without)
    cuda_graph_io: copy     # copy: caller tensors are copied into planned buffers around
                            # the replay | update: the graph reads and writes the caller's
                            # tensors and is re-captured and updated when their pointers change
    workdir: null           # path | null: keep sources, build.ninja and the partition
                            # report there (null: a fresh temporary directory, removed
                            # with the Library object that build() returns)
    params: embedded        # embedded (weights inside the .so) | sidecar (.safetensors)
    tuning:
      profile: auto         # true | false | auto (measure kernels when a GPU is visible)
      tuning_db: null       # path | null: JSON file remembering the fastest kernels
    input_shapes: {}        # {input name: [dims]}: static shapes for the model's inputs
    dims: {}                # {named dim: size or [sizes]}: every input's dim of that name, e.g. {batch: 1};
                            # a list builds one program per size (shape buckets) into one library,
                            # e.g. {batch: [1, 8, 32]}: run() takes the one the inputs' shapes fit,
                            # sizes between padded into the next where the dim allows it;
                            # "1..32": its ends and the powers of two between
    compile_jobs: null      # positive integer | null (null: one per CPU, at most one per 3 GiB of available memory)
    output: null            # path | null: where `byoc build` writes the .so
    devices:                # where work and data live (PlanDevices)
      pin: []               # ops or nodes that must run on another device, e.g.
                            #   - {op: softmax, device: cpu}   every softmax
                            #   - {node: "attn/probs", device: cpu/host-pinned}
                            # (node: the name of the value it computes, as in the IR);
                            # device: cpu | cuda | cpu/host-pinned (pinned host memory,
                            # so copies to and from the GPU run asynchronously) | cuda:<id>
      inputs: device        # device | host | host-pinned: where the caller's inputs are
      outputs: device       # device | host | host-pinned: where outputs are delivered

A bad key or value is a ConfigError that names the key path (`backends[1].cutlass.sm`),
the value and what is allowed. `load_config("cpu")` reads the shipped
build_configs/cpu.yaml (package byoc.build_configs).

Backend names a config may use: the ones registered with byoc.backend, the shipped ones
(KNOWN_BACKENDS) and any added with `register_known_backend(name)`; `validate` also takes
`known_backends=` to decide for itself.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import ConfigError
# the input sizes' keys (config_shapes.py); MAX_SHAPE_BUCKETS and size_range are this module's API too
from .config_shapes import MAX_SHAPE_BUCKETS, size_range  # noqa: F401
from .config_shapes import _check_bucket_count, _validate_dims, _validate_input_shapes

KEYS = ("target", "arch", "backends", "partition", "precision", "tf32", "cuda_graph", "cuda_graph_io", "workdir",
        "params", "tuning", "input_shapes", "dims", "compile_jobs", "output", "devices")
PARTITIONS = ("priority", "measured")
PRECISIONS = ("float32", "float16", "bfloat16")
PARAMS = ("embedded", "sidecar")
TUNING_KEYS = ("profile", "tuning_db")
TUNING_PROFILES = ("auto", True, False)
DEVICES_KEYS = ("pin", "inputs", "outputs")
IO_PLACES = ("device", "host", "host-pinned")
PIN_DEVICES = ("cpu", "cuda", "cpu/host-pinned")
PIN_SELECTORS = ("op", "node")
BUILTIN_BACKEND = "builtin"

# Backends a config may name although they are not registered yet: those shipped in
# backends/ (each registers itself when byoc.backends.<name> is imported).
KNOWN_BACKENDS = ["cutlass", "cudnn", "cublaslt", "builtin"]
# What `backends: auto` is on a cuda device, in priority order: those of them this machine
# can build (each backend's `unavailable` says what it lacks); on the cpu, none (builtin).
AUTO_CUDA_BACKENDS = ("cutlass", "cudnn", "cublaslt")


def register_known_backend(name: str):
    """Let configs name backend `name` before it is registered (a plugin's folder)."""
    if name not in KNOWN_BACKENDS:
        KNOWN_BACKENDS.append(name)


def known_backend_names() -> list[str]:
    """Shipped/declared names, then any registered with byoc.backend."""
    from .backend import BACKENDS
    return list(KNOWN_BACKENDS) + [name for name in BACKENDS if name not in KNOWN_BACKENDS]


@dataclass
class BuildConfig:
    target: object = "auto"  # "auto" or a device Target
    arch: list = field(default_factory=list)  # cuda: several archs in one library (empty: the target's)
    backends: list = field(default_factory=list)  # [(name, {options})] in priority order
    backends_auto: bool = False  # `backends: auto`: the list is the device's (for_device)
    partition: str = "priority"  # priority | measured
    precision: str = "float32"
    tf32: bool = False  # float32 matmuls and convs may run on TF32 tensor cores
    cuda_graph: bool = False
    cuda_graph_io: str = "copy"
    workdir: str | None = None
    params: str = "embedded"
    tuning: dict = field(default_factory=lambda: {"profile": "auto", "tuning_db": None})
    input_shapes: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)
    compile_jobs: int | None = None
    output: str | None = None
    devices: dict = field(default_factory=lambda: {"pin": [], "inputs": "device", "outputs": "device"})
    source: str = "<dict>"  # where the config came from, for messages

    def shape_buckets(self) -> list[dict]:
        """The named dims of each program the library holds: one per combination of the
        sizes `dims` lists (a dim given one size is that size in every one), smallest first."""
        import itertools
        names = sorted(self.dims)
        choices = [sorted(self.dims[name]) if isinstance(self.dims[name], list) else [self.dims[name]]
                   for name in names]
        # counted before the combinations are made: 40 dims of two sizes each would be 2**40
        # of them (memory runs out long before the limit is checked on the list)
        _check_bucket_count(self.source, self.dims)
        return [dict(zip(names, sizes)) for sizes in itertools.product(*choices)]

    @property
    def backend_names(self) -> list[str]:
        """The backends as listed (builtin only if the config lists it)."""
        return [name for name, _ in self.backends]

    @property
    def backend_order(self) -> list[str]:
        """The order partitioning offers ops to backends: as listed, builtin last."""
        return [name for name in self.backend_names if name != BUILTIN_BACKEND] + [BUILTIN_BACKEND]

    def to_dict(self) -> dict:
        """The config as plain data (what `validate` accepts back)."""
        return {"target": self.target if isinstance(self.target, str) else str(self.target), "arch": list(self.arch),
                "backends": "auto" if self.backends_auto else
                [{name: dict(options)} if options else name for name, options in self.backends],
                "partition": self.partition, "precision": self.precision, "tf32": self.tf32,
                "cuda_graph": self.cuda_graph, "cuda_graph_io": self.cuda_graph_io,
                "workdir": self.workdir,
                "params": self.params, "tuning": dict(self.tuning),
                "input_shapes": {name: list(dims) for name, dims in self.input_shapes.items()},
                "dims": dict(self.dims), "compile_jobs": self.compile_jobs, "output": self.output,
                "devices": {"pin": [dict(pin) for pin in self.devices["pin"]], "inputs": self.devices["inputs"],
                            "outputs": self.devices["outputs"]}}


# ---- reading ----------------------------------------------------------------------------------

def _shipped_configs():
    return importlib.resources.files("byoc.build_configs")


def shipped_config_names() -> list[str]:
    return sorted(entry.name[:-len(".yaml")] for entry in _shipped_configs().iterdir()
                  if entry.name.endswith(".yaml"))


def _read(spec) -> tuple[dict, str]:
    """(data, source) from a dict, a YAML path, or a shipped config's name."""
    if isinstance(spec, dict):
        return dict(spec), "<dict>"
    text_spec = str(spec)
    path = Path(text_spec)
    if not path.suffix and not path.exists():  # a bare name: a shipped config
        shipped = _shipped_configs() / f"{text_spec}.yaml"
        if not shipped.is_file():
            raise ConfigError(f"no build config named {text_spec!r}; shipped configs: "
                              f"{', '.join(shipped_config_names())}, or give a YAML path")
        text, source = shipped.read_text(), f"build_configs/{text_spec}.yaml"
    elif not path.exists():
        raise ConfigError(f"build config file {text_spec!r} does not exist")
    elif not path.is_file():
        raise ConfigError(f"build config file {text_spec!r} is not a regular file (a directory, FIFO or device); "
                          f"expected a YAML file")
    else:
        try:
            size = path.stat().st_size
            if size > MAX_CONFIG_BYTES:
                raise ConfigError(f"build config file {text_spec!r} is {size} bytes; expected a YAML file of at "
                                  f"most {MAX_CONFIG_BYTES} bytes (a build config is a few dozen lines)")
            with open(path, "rb") as handle:  # no more than the limit, whatever the file does meanwhile
                text, source = handle.read(MAX_CONFIG_BYTES + 1).decode("utf-8"), str(path)
        except OSError as error:
            raise ConfigError(f"build config file {text_spec!r} cannot be read: {error.strerror or error}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"build config file {text_spec!r} is not a YAML text file "
                              f"(it is not UTF-8 text; a binary file?)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: not valid YAML: {error}") from None
    if data is None:  # an empty file: every default
        data = {}
    _check_expanded_size(data, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys ({', '.join(KEYS)}), got {type(data).__name__}")
    return data, source


# A build config is a few dozen lines; these bound what one may hold before any key is read.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000


def _check_expanded_size(data, source: str):
    """A ConfigError when the YAML's values, counted as they would be walked (an alias as
    often as it is used), exceed MAX_CONFIG_VALUES: a file of nested aliases (a "billion
    laughs") is small but expands beyond any memory."""
    count, stack = 0, [data]
    while stack:
        value = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"{source}: expands to more than {MAX_CONFIG_VALUES} values (nested YAML aliases?); "
                              f"expected a build config of a few dozen keys")
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)


def load_config(spec="default", overrides: dict | None = None, known_backends=None) -> BuildConfig:
    """A validated BuildConfig from a shipped config's name ("cpu", "default"), a YAML
    path, a dict or a BuildConfig; `overrides` replace top-level keys."""
    if isinstance(spec, BuildConfig):
        data, source = spec.to_dict(), spec.source
    else:
        data, source = _read(spec)
    overrides = dict(overrides or {})
    if "target" in overrides and "cuda_graph" not in overrides and _target_kind(overrides["target"]) == "cpu":
        # `-c cuda_sm90 --target cpu`: the caller moved a cuda config to the cpu, where
        # there are no CUDA graphs to capture; a config file saying both is refused
        overrides["cuda_graph"] = False
    data.update(overrides)
    try:
        return validate(data, source, known_backends=known_backends)
    except ConfigError as error:
        # a bad override is the caller's, not the config file's: name it as theirs
        text = str(error)
        for key in overrides:
            if text.startswith(f"{source}: {key}:") or text.startswith(f"{source}: {key}."):
                raise ConfigError(f"{text[len(source) + 2:]} (given on the command line or to build(), "
                                  f"overriding {source})") from None
        raise


def for_device(config: BuildConfig, device) -> tuple:
    """(config with `backends: auto` made the list for `device`, a note for each backend it
    left out): on a cuda device AUTO_CUDA_BACKENDS that this machine can build, in order; on
    the cpu none (the built-in backend takes every op). A config with a list is as it was."""
    import dataclasses
    if not config.backends_auto:
        return config, []
    chosen, notes = [], []
    if device.kind == "cuda":
        from .backend import get_backend
        for name in AUTO_CUDA_BACKENDS:
            unavailable = get_backend(name).unavailable
            lacking = unavailable() if unavailable is not None else None
            if lacking:
                notes.append(f"backends: auto leaves out {name}: this machine lacks {lacking}")
            else:
                chosen.append((name, {}))
    return dataclasses.replace(config, backends=chosen, backends_auto=False), notes


def _target_kind(spec) -> str | None:
    """The kind of a target override, or None when it does not parse (validate says why)."""
    from .target import Target
    try:
        return Target(spec).kind
    except ConfigError:
        return None


# ---- validation -------------------------------------------------------------------------------

def _fail(source, key_path, message):
    raise ConfigError(f"{source}: {key_path}: {message}")


def _did_you_mean(word, choices) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _one_of(source, key_path, value, allowed, shown=None):
    # `value in allowed` alone would take 1 for True and 0 for False.
    if not any(value == choice and type(value) is type(choice) for choice in allowed):
        _fail(source, key_path, f"{value!r} is not allowed; allowed: {shown or ', '.join(map(str, allowed))}")
    return value


def _optional_path(source, key_path, value):
    if value is not None and not isinstance(value, (str, Path)):
        _fail(source, key_path, f"{value!r} is not allowed; allowed: a path, or null")
    return str(value) if value is not None else None


def validate(data: dict, source: str = "<dict>", known_backends=None) -> BuildConfig:
    """Check every key of `data` and return the BuildConfig; the first problem found is a
    ConfigError naming its key path."""
    unknown = [key for key in data if key not in KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; allowed keys: {', '.join(KEYS)}"
                          f"{_did_you_mean(unknown[0], KEYS)}")
    config = BuildConfig(source=source)
    config.target = _validate_target(source, data.get("target", "auto"))
    config.arch = _validate_arch(source, data.get("arch"), config.target)
    config.backends_auto = data.get("backends") == "auto"
    config.backends = [] if config.backends_auto else _validate_backends(source, data.get("backends"), known_backends)
    config.partition = _one_of(source, "partition", data.get("partition", "priority"), PARTITIONS)
    config.precision = _one_of(source, "precision", data.get("precision", "float32"), PRECISIONS)
    config.tf32 = _one_of(source, "tf32", data.get("tf32", False), (True, False), "true, false")
    config.cuda_graph = _one_of(source, "cuda_graph", data.get("cuda_graph", False), (True, False), "true, false")
    # A CUDA graph captures GPU work: on the cpu target it would be dropped without a word.
    # target: auto is allowed, as it may build for a GPU (without one it builds without graphs).
    if config.cuda_graph and getattr(config.target, "kind", None) == "cpu":
        _fail(source, "cuda_graph", f"true needs the cuda target, but target is {str(config.target)!r}; allowed: "
                                    f"cuda_graph: false with it, or target: cuda -arch=sm_XX or auto")
    config.cuda_graph_io = _one_of(source, "cuda_graph_io", data.get("cuda_graph_io", "copy"), ("copy", "update"))
    config.workdir = _optional_path(source, "workdir", data.get("workdir"))
    config.params = _one_of(source, "params", data.get("params", "embedded"), PARAMS)
    config.tuning = _validate_tuning(source, data.get("tuning"))
    config.input_shapes = _validate_input_shapes(source, data.get("input_shapes"))
    config.dims = _validate_dims(source, data.get("dims"))
    jobs = data.get("compile_jobs")
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        _fail(source, "compile_jobs", f"{jobs!r} is not allowed; allowed: a positive integer, or null")
    config.compile_jobs = jobs
    config.output = _optional_path(source, "output", data.get("output"))
    config.devices = _validate_devices(source, data.get("devices"))
    return config


def _validate_arch(source, arch, target) -> list:
    """`arch`: CUDA archs a cuda library holds kernels for, each a program of its own that
    the runtime picks by the device (null or []: the target's arch alone)."""
    from .target import CUDA_ARCHES
    if arch is None:
        return []
    if isinstance(arch, str):
        arch = [arch]
    if not isinstance(arch, list) or not all(isinstance(a, str) for a in arch):
        _fail(source, "arch", f"{arch!r} is not allowed; allowed: a list of CUDA archs ({', '.join(CUDA_ARCHES)}), "
                              f"e.g. [sm_80, sm_90]")
    for entry in arch:
        if entry not in CUDA_ARCHES:
            _fail(source, "arch", f"{entry!r} is not a CUDA arch byoc builds for; allowed: {', '.join(CUDA_ARCHES)}"
                                  f"{_did_you_mean(entry, CUDA_ARCHES)}")
    def number(name):
        return int("".join(c for c in name if c.isdigit()))
    repeated = sorted({a for a in arch if sum(number(b) == number(a) for b in arch) > 1})
    if repeated:
        _fail(source, "arch", f"{', '.join(repeated)}: the same arch listed more than once (sm_90 and sm_90a are "
                              f"one, the runtime tells them by number); expected each arch once")
    if arch and getattr(target, "kind", None) == "cpu":
        _fail(source, "arch", f"{arch} needs a cuda target, but target is 'cpu'; allowed: arch with target cuda "
                              f"or auto, or no arch")
    return sorted(arch, key=number)


def _validate_target(source, target):
    from .target import DEVICE_KINDS, Target
    if target in (None, "auto"):
        return "auto"
    try:
        parsed = Target(target)
    except ConfigError as error:
        _fail(source, "target", str(error))
    if parsed.kind not in DEVICE_KINDS:
        _fail(source, "target", f"{target!r} is not a device target; allowed: auto, cpu, cuda -arch=sm_XX "
                                f"(backend targets such as {parsed.kind!r} go under backends)")
    return parsed


def _validate_backends(source, backends, known_backends) -> list:
    if backends is None:
        return []
    if not isinstance(backends, list):
        _fail(source, "backends", f"{backends!r} is not allowed; allowed: a list of backend names or "
                                  f"{{name: options}}, or auto")
    known = list(known_backends) if known_backends is not None else known_backend_names()
    result, seen = [], set()
    for index, item in enumerate(backends):
        where = f"backends[{index}]"
        if isinstance(item, str):
            name, options = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            name, options = next(iter(item.items()))
            options = {} if options is None else options
            if not isinstance(options, dict):
                _fail(source, f"{where}.{name}", f"{options!r} is not a mapping of the backend's target attributes")
        else:
            _fail(source, where, f"{item!r} is not a backend name or a one-key mapping {{name: options}}")
        if name not in known:
            _fail(source, where, f"unknown backend {name!r}; allowed: {', '.join(known)}{_did_you_mean(name, known)}")
        if name in seen:
            _fail(source, where, f"backend {name!r} is listed twice")
        if name == BUILTIN_BACKEND and index != len(backends) - 1:
            _fail(source, where, f"{BUILTIN_BACKEND!r} must be last: it takes every op the other backends "
                                 "did not claim (leave it out and it is added last)")
        seen.add(name)
        _check_backend_options(source, f"{where}.{name}", name, options)
        result.append((name, dict(options)))
    return result


def _check_backend_options(source, where, name, options):
    """Options are the backend Target's attributes; check them now so the error names the
    config key (a shipped backend registers its target kind when its package is imported)."""
    from .target import TARGET_KINDS, Target
    if name not in TARGET_KINDS:
        package = f"byoc.backends.{name}"
        try:
            importlib.import_module(package)
        except ModuleNotFoundError as error:
            # Only "this backend has no package" is expected; a package that fails to import
            # for another reason must say so rather than look like a backend without options.
            if error.name not in (package, "byoc.backends"):
                raise
    if name not in TARGET_KINDS:
        if options:
            _fail(source, where, f"backend {name!r} takes no options (given {sorted(options)})")
        return
    for attribute, value in options.items():
        try:
            Target(name, **{attribute: value})
        except ConfigError as error:
            _fail(source, f"{where}.{attribute}", str(error))


def _section(source, name: str, value, keys) -> dict:
    """A config section: a mapping (or null, for empty) whose keys are all in `keys`."""
    value = {} if value is None else value
    if not isinstance(value, dict):
        _fail(source, name, f"{value!r} is not a mapping; allowed keys: {', '.join(keys)}")
    for key in value:
        if key not in keys:
            _fail(source, f"{name}.{key}", f"unknown key; allowed: {', '.join(keys)}{_did_you_mean(key, keys)}")
    return value


def _validate_tuning(source, tuning) -> dict:
    tuning = _section(source, "tuning", tuning, TUNING_KEYS)
    profile = _one_of(source, "tuning.profile", tuning.get("profile", "auto"), TUNING_PROFILES, "auto, true, false")
    return {"profile": profile, "tuning_db": _optional_path(source, "tuning.tuning_db", tuning.get("tuning_db"))}


def _pin_device(source, key_path, value) -> str:
    """A pin's device as VirtualDevice text: cpu, cuda, cpu/host-pinned, or a numbered GPU
    (cuda:1; cuda:0 is cuda). Any id is representable; the build says which it can run."""
    from .ir.virtual_device import VirtualDevice
    allowed = f"{', '.join(PIN_DEVICES)}, or a numbered GPU such as cuda:1"
    if not isinstance(value, str):
        _fail(source, key_path, f"{value!r} is not allowed; allowed: {allowed}")
    try:
        device = VirtualDevice.parse(value)
    except ValueError:
        _fail(source, key_path, f"{value!r} is not allowed; allowed: {allowed}")
    if device.device_type == "cpu" and device.device_id != 0:  # one host
        _fail(source, key_path, f"{value!r} is not allowed; allowed: {allowed}")
    return str(device)


def _validate_devices(source, devices) -> dict:
    devices = _section(source, "devices", devices, DEVICES_KEYS)
    pins = devices.get("pin") or []
    if not isinstance(pins, list):
        _fail(source, "devices.pin", f"{pins!r} is not a list of {{op: <op>, device: <device>}} or "
                                     f"{{node: <name>, device: <device>}}")
    result = []
    for index, pin in enumerate(pins):
        where = f"devices.pin[{index}]"
        if not isinstance(pin, dict):
            _fail(source, where, f"{pin!r} is not a mapping {{op: <op>, device: <device>}} or "
                                 f"{{node: <name>, device: <device>}}")
        unknown = [key for key in pin if key not in PIN_SELECTORS + ("device",)]
        if unknown:
            _fail(source, f"{where}.{unknown[0]}", f"unknown key; allowed: op, node, device"
                                                   f"{_did_you_mean(unknown[0], PIN_SELECTORS + ('device',))}")
        selectors = [key for key in PIN_SELECTORS if key in pin]
        if len(selectors) != 1:
            _fail(source, where, f"{pin!r} must name exactly one of op, node")
        selector = selectors[0]
        name = pin[selector]
        if not isinstance(name, str) or not name:
            _fail(source, f"{where}.{selector}", f"{name!r} is not allowed; allowed: a non-empty string")
        if selector == "op":
            from .ir.op import list_ops
            ops = [op for op in list_ops() if op not in ("on_device", "device_copy")]
            if name not in ops:
                _fail(source, f"{where}.op", f"unknown op {name!r}; allowed: an IR op (`byoc ops` lists them)"
                                             f"{_did_you_mean(name, ops)}")
        if "device" not in pin:
            _fail(source, f"{where}.device", f"missing; allowed: {', '.join(PIN_DEVICES)}")
        result.append({selector: name, "device": _pin_device(source, f"{where}.device", pin["device"])})
    inputs = _one_of(source, "devices.inputs", devices.get("inputs", "device"), IO_PLACES)
    outputs = _one_of(source, "devices.outputs", devices.get("outputs", "device"), IO_PLACES)
    return {"pin": result, "inputs": inputs, "outputs": outputs}
