"""Backend registration: a name, a flavor, an ordered pattern table (pattern + check per
entry), a codegen entry, and where its functions run.

    register_backend("cutlass", flavor="csource", patterns=[
        PatternEntry("dense_bias_gelu", make_dense_pattern(bias=True, activation="gelu"), check_dense),
    ], codegen=cutlass_codegen, device="cuda")

A check receives the Match and returns None to accept or a string saying why not
("K=770 not a multiple of 8"); the partition report shows every refusal. Backends live in
backends/<name>/ (installed as byoc.backends.<name>); importing that package registers it.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
from dataclasses import dataclass, field
from typing import Callable

from .errors import BuildError, ConfigError

FLAVORS = ("csource", "json", "shim")
# The backend that takes every op nobody else claimed (the config keeps it last).
FALLBACK = "builtin"
ARTIFACT_KINDS = ("source", "object", "json", "shim")


@dataclass
class PatternEntry:
    name: str  # the composite is named "<backend>.<name>"
    pattern: object  # a byoc.pattern.Pattern
    check: Callable | None = None  # Match -> None | reason


@dataclass
class Backend:
    name: str
    flavor: str
    patterns: list
    codegen: Callable  # (functions: dict[symbol, Function], target) -> list[Artifact]
    # Where its functions run, read their parameters and write their result (PlanDevices
    # takes these as fixed constraints): "cuda", "cpu", or "any" (the build's device).
    device: str = "cuda"
    memory_scope: str = "global"
    one_composite_per_function: bool = False
    capturable: bool = True  # its functions only launch kernels: CUDA graphs may capture them
    # Ops whose float16/bfloat16 kernels compute their statistics (sums, means, variances)
    # in float32 internally: a float16 build then gives them float16 in and out instead of
    # a cast pair around a float32 op.
    float32_statistics: frozenset = frozenset()
    # (mod, target, build_device) -> mod: rewrites this backend needs before any backend's
    # patterns look (the cutlass backend: NHWC conv chains), run when it is in the build
    pre_partition: Callable | None = None
    # The catch-all backend (FALLBACK) only: mod -> mod, outlining every op no backend
    # claimed into its functions (the partitioner's last step), and (binding, attrs) ->
    # bindings, outlining one op call (PinDevices: an op pinned to a device).
    takes_the_rest: Callable | None = None
    outline_op: Callable | None = None
    # (mod, report) -> mod: blocks this backend runs as one kernel and no other backend
    # offers, outlined into its functions before any backend's patterns look (the built-in
    # backend: squeeze-and-excitation), with refusals in the report
    claims_first: Callable | None = None
    # (functions: dict[symbol, Function], target) -> microseconds or None: what one run of
    # these functions costs on the visible GPU as the backend has measured it already (the
    # cutlass backend: its tuning database's times for the kernels it would choose), so
    # that partition: measured need not build and time a candidate of this backend's; None
    # where it does not know them all
    known_cost: Callable | None = None
    # (candidates: list[dict[symbol, Function]], target) -> None: measures at once what
    # known_cost will be asked of these candidates (the cudnn backend: every conv's plans in
    # one process), before it is asked
    learn_costs: Callable | None = None
    # () -> str or None: what this machine lacks to build the backend's functions (the
    # package to install), None where it has everything; `backends: auto` (config.py)
    # leaves out a backend that lacks something, and says so
    unavailable: Callable | None = None
    # (target, workdir, dtypes, epilogues) -> list[CompileUnit]: the units a kernel library
    # holds for this backend (byoc/kernel_library.py: compiled once per machine, found
    # behind the object cache), their sources written under workdir (the cutlass backend:
    # every tuning candidate with its epilogue proxies)
    kernel_library: Callable | None = None

    def virtual_device(self, build_device: str):
        """The VirtualDevice of this backend's functions' parameters and results in a build
        for device kind `build_device` ("cpu" or "cuda")."""
        from .ir.virtual_device import VirtualDevice
        if build_device == "cpu":  # a cpu build compiles every backend for the cpu
            return VirtualDevice("cpu")
        device = build_device if self.device == "any" else self.device
        return VirtualDevice(device, 0, self.memory_scope)


@dataclass
class Artifact:
    """What a backend's codegen returns: the extern symbols it implements and what the
    toolchain and the host code need to build and call them."""
    backend: str
    kind: str  # source | object | json | shim
    symbols: list
    compile_units: list = field(default_factory=list)  # byoc.toolchain.CompileUnit, linked into the library
    workspace_bytes: dict = field(default_factory=dict)  # symbol -> scratch bytes one call needs
    link_libraries: list = field(default_factory=list)  # e.g. ["cublasLt"]
    # symbols whose state belongs to a model instance: the library defines
    # SYMBOL_init(weights, weights_bytes, void** state) and SYMBOL_destroy(void* state), and
    # SYMBOL takes that state as its first argument
    stateful_symbols: list = field(default_factory=list)
    # symbols whose result only reinterprets their first argument (reshapes): never called,
    # the result is the argument's storage
    view_symbols: list = field(default_factory=list)
    kernels: dict = field(default_factory=dict)  # symbol -> kernel name (metadata, report.html)
    # symbol -> byoc.transform.plan_devices.FunctionDevices: where a lowered function reads
    # each parameter and writes its result, for functions that differ from their backend's
    # one device (e.g. a parameter read from pinned host memory); PlanDevices copies each
    # argument where its parameter is
    devices: dict = field(default_factory=dict)

    def ir_summary(self) -> str:
        """How a module dump lists it (pipeline.py: the artifacts attribute)."""
        return f"{self.backend} ({self.kind}, {len(self.symbols)} functions, {len(self.compile_units)} units)"

    def __post_init__(self):
        if self.kind not in ARTIFACT_KINDS:
            raise BuildError(f"artifact of backend {self.backend!r}: kind {self.kind!r} is not one of "
                             f"{', '.join(ARTIFACT_KINDS)}")


BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, flavor: str, patterns: list, codegen: Callable, device: str = "cuda",
                     memory_scope: str = "global", one_composite_per_function: bool = False,
                     capturable: bool = True, float32_statistics=(), pre_partition: Callable | None = None,
                     takes_the_rest: Callable | None = None, outline_op: Callable | None = None,
                     claims_first: Callable | None = None, known_cost: Callable | None = None,
                     learn_costs: Callable | None = None, unavailable: Callable | None = None,
                     kernel_library: Callable | None = None) -> Backend:
    from .ir.op import OP_REGISTRY, get_op
    from .pattern import ops_named
    if flavor not in FLAVORS:
        raise ConfigError(f"backend {name!r}: flavor {flavor!r} is not one of {', '.join(FLAVORS)}")
    get_op("add")  # make sure the op registry is loaded
    names = [entry.name for entry in patterns]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"backend {name!r}: pattern name(s) {', '.join(repeated)} appear more than once")
    for entry in patterns:
        for op_name in ops_named(entry.pattern):
            if op_name not in OP_REGISTRY:
                raise ConfigError(f"backend {name!r}: pattern {entry.name!r} names unknown op {op_name!r}")
    for op_name in float32_statistics:
        if op_name not in OP_REGISTRY:
            raise ConfigError(f"backend {name!r}: float32_statistics names unknown op {op_name!r}")
    backend = Backend(name, flavor, list(patterns), codegen, device, memory_scope, one_composite_per_function,
                      capturable, frozenset(float32_statistics), pre_partition, takes_the_rest, outline_op,
                      claims_first, known_cost, learn_costs, unavailable, kernel_library)
    BACKENDS[name] = backend
    return backend


def unregister_backend(name: str):
    BACKENDS.pop(name, None)


@contextlib.contextmanager
def registered(backend_args: dict | None = None, **kwargs):
    """Register a backend for the duration of a block (tests), given register_backend's
    arguments as a dict or as keywords; a backend of the same name comes back afterwards."""
    arguments = {**(backend_args or {}), **kwargs}
    previous = BACKENDS.get(arguments.get("name"))
    backend = register_backend(**arguments)
    try:
        yield backend
    finally:
        unregister_backend(backend.name)
        if previous is not None:
            BACKENDS[previous.name] = previous


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        try:  # backends register themselves when their package is imported
            importlib.import_module(f"byoc.backends.{name}")
        except ModuleNotFoundError as error:
            if error.name not in (f"byoc.backends.{name}", "byoc.backends"):
                raise
    if name not in BACKENDS:
        raise BuildError(f"no backend named {name!r} is registered; known backends: "
                         f"{', '.join(sorted(BACKENDS)) or '(none)'}")
    return BACKENDS[name]


def list_backends() -> list[str]:
    return sorted(BACKENDS)


_current_target = contextvars.ContextVar("byoc_codegen_target", default=None)


@contextlib.contextmanager
def codegen_target(target):
    token = _current_target.set(target)
    try:
        yield target
    finally:
        _current_target.reset(token)


def current_target():
    """The Target of the backend whose codegen is running."""
    return _current_target.get()


_partition_targets = contextvars.ContextVar("byoc_partition_targets", default=None)


@contextlib.contextmanager
def partition_targets(targets: dict):
    """While a build partitions: each backend's Target by name, for partition_target."""
    token = _partition_targets.set(dict(targets))
    try:
        yield
    finally:
        _partition_targets.reset(token)


def partition_target(name: str):
    """The Target of backend `name` in the build being partitioned, whose attributes a
    pattern check may read (cudnn: float32 convs only with tf32); None outside a build
    (a module partitioned by hand), where a check takes what the backend could take."""
    targets = _partition_targets.get()
    return None if targets is None else targets.get(name)
