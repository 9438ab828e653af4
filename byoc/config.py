"""Build configurations (YAML files in build_configs/, or dicts).

Keys (all optional):

    target: auto                 # auto | cpu | "cuda -arch=sm_90" | {kind: cuda, arch: sm_90}
    backends:                    # priority order; builtin is always implicitly last
      - cutlass: {sm: 90}        # a name, or {name: {target attributes}}
      - cublaslt
    precision: float16           # float32 | float16 | bfloat16
    cuda_graph: false            # capture static regions into CUDA graphs
    workdir: null                # keep sources, build.ninja, partition report here
    params: embedded             # embedded (inside the .so) | sidecar (.safetensors)
    tuning: {profile: auto, tuning_db: null}   # profile: auto | true | false
    input_shapes: {input_ids: [1, 128]}
    compile_jobs: null           # parallel compile jobs (default: CPU count)
    output: null                 # where `byoc build` writes the .so

A bad key or value is a ConfigError that names the key path, the value and what is
allowed. `load_config("cpu")` reads the shipped build_configs/cpu.yaml.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import ConfigError

KEYS = ("target", "backends", "precision", "cuda_graph", "workdir", "params", "tuning", "input_shapes",
        "compile_jobs", "output")
PRECISIONS = ("float32", "float16", "bfloat16")
PARAMS = ("embedded", "sidecar")
TUNING_KEYS = ("profile", "tuning_db")
# Backends a config may name (those with a folder in backends/); checked again against the
# registry when the build imports them.
KNOWN_BACKENDS = ("cutlass", "cublaslt", "builtin")


@dataclass
class BuildConfig:
    target: object = "auto"
    backends: list = field(default_factory=list)  # [(name, {options})]
    precision: str = "float32"
    cuda_graph: bool = False
    workdir: str | None = None
    params: str = "embedded"
    tuning: dict = field(default_factory=lambda: {"profile": "auto", "tuning_db": None})
    input_shapes: dict = field(default_factory=dict)
    compile_jobs: int | None = None
    output: str | None = None
    source: str = "<dict>"

    @property
    def backend_names(self) -> list[str]:
        return [name for name, _ in self.backends]


def shipped_config_names() -> list[str]:
    import byoc.build_configs
    return sorted(p.stem for p in Path(byoc.build_configs.__file__).parent.glob("*.yaml"))


def _read(spec) -> tuple[dict, str]:
    if isinstance(spec, BuildConfig):
        raise TypeError("already a BuildConfig")
    if isinstance(spec, dict):
        return dict(spec), "<dict>"
    text_spec = str(spec)
    path = Path(text_spec)
    if not path.suffix and not path.exists():
        import byoc.build_configs
        path = Path(byoc.build_configs.__file__).parent / f"{text_spec}.yaml"
        if not path.exists():
            raise ConfigError(f"no build config named {text_spec!r}; shipped configs: "
                              f"{', '.join(shipped_config_names())}, or give a YAML path")
    if not path.is_file():
        raise ConfigError(f"build config file {text_spec!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys ({', '.join(KEYS)}), got {type(data).__name__}")
    return data, str(path)


def load_config(spec="default", overrides: dict | None = None) -> BuildConfig:
    if isinstance(spec, BuildConfig):
        data, source = {k: getattr(spec, k) for k in KEYS}, spec.source
        data["backends"] = [{n: o} if o else n for n, o in spec.backends]
    else:
        data, source = _read(spec)
    data.update(overrides or {})
    return validate(data, source)


def _fail(source, path, message):
    raise ConfigError(f"{source}: {path}: {message}")


def validate(data: dict, source: str = "<dict>") -> BuildConfig:
    from .target import Target
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; allowed keys: {', '.join(KEYS)}")
    config = BuildConfig(source=source)

    target = data.get("target", "auto")
    if target not in (None, "auto"):
        try:
            parsed = Target(target)
        except ConfigError as error:
            _fail(source, "target", str(error))
        if parsed.kind not in ("cpu", "cuda"):
            _fail(source, "target", f"{target!r} is not a device target; allowed: auto, cpu, cuda -arch=sm_XX")
        config.target = parsed
    else:
        config.target = "auto"

    backends = data.get("backends") or []
    if not isinstance(backends, list):
        _fail(source, "backends", f"{backends!r} is not a list of backend names or {{name: options}}")
    seen = set()
    for index, item in enumerate(backends):
        where = f"backends[{index}]"
        if isinstance(item, str):
            name, options = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            name, options = next(iter(item.items()))
            options = options or {}
            if not isinstance(options, dict):
                _fail(source, f"{where}.{name}", f"{options!r} is not a mapping of target attributes")
        else:
            _fail(source, where, f"{item!r} is not a backend name or a one-key mapping {{name: options}}")
        if name not in KNOWN_BACKENDS:
            _fail(source, where, f"unknown backend {name!r}; allowed: {', '.join(KNOWN_BACKENDS)}")
        if name in seen:
            _fail(source, where, f"backend {name!r} is listed twice")
        seen.add(name)
        _check_backend_options(source, f"{where}.{name}", name, options)
        config.backends.append((name, dict(options)))

    precision = data.get("precision", "float32")
    if precision not in PRECISIONS:
        _fail(source, "precision", f"{precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
    config.precision = precision

    cuda_graph = data.get("cuda_graph", False)
    if not isinstance(cuda_graph, bool):
        _fail(source, "cuda_graph", f"{cuda_graph!r} is not allowed; allowed: true, false")
    config.cuda_graph = cuda_graph

    workdir = data.get("workdir")
    if workdir is not None and not isinstance(workdir, (str, Path)):
        _fail(source, "workdir", f"{workdir!r} is not a path")
    config.workdir = str(workdir) if workdir is not None else None

    params = data.get("params", "embedded")
    if params not in PARAMS:
        _fail(source, "params", f"{params!r} is not allowed; allowed: {', '.join(PARAMS)}")
    config.params = params

    tuning = data.get("tuning") or {}
    if not isinstance(tuning, dict):
        _fail(source, "tuning", f"{tuning!r} is not a mapping with keys {', '.join(TUNING_KEYS)}")
    for key in tuning:
        if key not in TUNING_KEYS:
            _fail(source, f"tuning.{key}", f"unknown key; allowed: {', '.join(TUNING_KEYS)}")
    profile = tuning.get("profile", "auto")
    if profile not in ("auto", True, False):
        _fail(source, "tuning.profile", f"{profile!r} is not allowed; allowed: auto, true, false")
    config.tuning = {"profile": profile, "tuning_db": tuning.get("tuning_db")}

    shapes = data.get("input_shapes") or {}
    if not isinstance(shapes, dict):
        _fail(source, "input_shapes", f"{shapes!r} is not a mapping of input name to a list of dims")
    for name, dims in shapes.items():
        if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                         and d >= 0 for d in dims):
            _fail(source, f"input_shapes.{name}", f"{dims!r} is not a list of non-negative integers")
    config.input_shapes = {name: tuple(dims) for name, dims in shapes.items()}

    jobs = data.get("compile_jobs")
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        _fail(source, "compile_jobs", f"{jobs!r} is not a positive integer")
    config.compile_jobs = jobs
    output = data.get("output")
    config.output = str(output) if output is not None else None
    return config


def _check_backend_options(source, where, name, options):
    """Options are the backend Target's attributes; check them now so the error names the
    config key (the backend registers its target kind when imported)."""
    from .target import TARGET_KINDS, Target
    try:
        import importlib
        importlib.import_module(f"byoc.backends.{name}")
    except ImportError:
        pass
    if name not in TARGET_KINDS:
        if options:
            _fail(source, where, f"backend {name!r} takes no options (given {sorted(options)})")
        return
    try:
        Target(name, **options)
    except ConfigError as error:
        _fail(source, where, str(error))
