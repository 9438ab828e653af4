"""Targets: a kind plus typed attributes, for devices ("cuda", "cpu") and for each
backend's external codegen ("cutlass", "cublaslt", "builtin").

    Target("cuda -arch=sm_90")            Target("cuda", arch="sm_90")
    Target({"kind": "cutlass", "sm": 90, "use_fast_math": True})

Every kind has an attribute schema (name -> type, default, allowed values); a string
target is `<kind> -<name>=<value> ...` and `str(target)` gives that text back.
Compiler flags come only from targets (`nvcc_flags()`, `cxx_flags()`), so a build never
asks the user for options at link time. Backends add their kinds with
`register_target_kind`. `with target:` makes it current for codegen (`Target.current()`).
"""
from __future__ import annotations

import contextvars
import difflib
import functools
import importlib.util
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from .errors import ConfigError
from .user_text import parse_ascii_integer

CUDA_ARCHES = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_120")
DEVICE_KINDS = ("cuda", "cpu")
_BOOL_TEXT = {"1": True, "true": True, "0": False, "false": False}


@dataclass(frozen=True)
class AttrSchema:
    """One attribute of a target kind; its name is the key in the kind's schema."""
    type: type  # bool, int, str, float or list
    default: object = None
    allowed: tuple | None = None  # None: any value of `type`
    doc: str = ""
    # value (converted to `type`) -> None, or what is wrong with it ("has -3, expected ...")
    check: object = None


TARGET_KINDS: dict[str, dict[str, AttrSchema]] = {
    "cuda": {
        "arch": AttrSchema(str, "sm_90", CUDA_ARCHES, "GPU architecture the code is compiled for"),
        "opt_level": AttrSchema(int, 3, (0, 1, 2, 3), "-O level for nvcc and the host compiler"),
        "use_fast_math": AttrSchema(bool, False, None, "nvcc --use_fast_math"),
        "debug": AttrSchema(bool, False, None, "-g -lineinfo"),
        "pdl": AttrSchema(bool, True, None, "sm_90 and later: the built-in kernels launch with programmatic "
                          "dependent launch (start while the previous kernel drains, wait before touching memory)"),
        "ptx": AttrSchema(bool, False, None, "PTX beside the machine code (not for sm_XXa): a GPU of a later arch "
                          "compiles it when it loads the library"),
    },
    "cpu": {
        "march": AttrSchema(str, "", None, "-march= for g++ (empty: the compiler's default)"),
        "opt_level": AttrSchema(int, 2, (0, 1, 2, 3), "-O level"),
        "debug": AttrSchema(bool, False, None, "-g"),
    },
}

_current = contextvars.ContextVar("byoc_current_target", default=None)


def register_target_kind(kind: str, attrs: dict[str, AttrSchema]):
    """Add (or replace) a target kind; backends call this when they register."""
    for name, schema in attrs.items():
        if not isinstance(schema, AttrSchema):
            raise ConfigError(f"target kind {kind!r}: attribute {name!r} needs an AttrSchema, "
                              f"got {type(schema).__name__}")
    TARGET_KINDS[kind] = dict(attrs)


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _describe_allowed(schema: AttrSchema) -> str:
    if schema.allowed is not None:
        return ", ".join(map(str, schema.allowed))
    return {bool: "true, false, 1, 0", int: "an integer", float: "a number",
            list: "a list (or comma-separated text)"}.get(schema.type, "any text")


def _convert(kind: str, name: str, schema: AttrSchema, value):
    """`value` (text from a target string, or a Python value) as the schema's type."""
    def fail(what):
        raise ConfigError(f"target {kind}: attribute {name}={value!r} {what}; "
                          f"allowed: {_describe_allowed(schema)}")
    if schema.type is bool:
        if isinstance(value, bool):
            converted = value
        elif isinstance(value, (int, str)) and str(value).lower() in _BOOL_TEXT:
            converted = _BOOL_TEXT[str(value).lower()]
        else:
            fail("is not a boolean")
    elif schema.type is int:
        # bool is an int in Python, and int(2.5) would silently truncate: refuse both.
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            fail("is not an integer")
        if isinstance(value, str):
            # ASCII digits only: int() takes '٣' for 3 and '1_0' for 10, and raises on 5,000 digits
            converted = parse_ascii_integer(value, signed=True)
            if converted is None:
                fail("is not an integer (in ASCII digits, within int64)")
        else:
            try:
                converted = int(value)
            except (TypeError, ValueError, OverflowError):  # OverflowError: int(float('inf'))
                fail("is not an integer")
    elif schema.type is float:
        try:
            converted = float(value)
        except (TypeError, ValueError):
            fail("is not a number")
    elif schema.type is list:
        if isinstance(value, str):
            converted = [item.strip() for item in value.split(",") if item.strip()]
        elif isinstance(value, (list, tuple)):
            converted = list(value)
        else:
            fail("is not a list")
    else:
        if isinstance(value, (dict, list, tuple)):
            fail("is not text")
        converted = str(value)
    if schema.allowed is not None and converted not in schema.allowed:
        fail("is not allowed")
    flaw = schema.check(converted) if schema.check else None
    if flaw:
        raise ConfigError(f"target {kind}: attribute {name}={value!r} {flaw}")
    return converted


def at_least(lowest: int):
    """An AttrSchema check: an integer of at least `lowest`."""
    def check(value):
        return None if value >= lowest else f"is below {lowest}; expected an integer of at least {lowest}"
    return check


def each(item_check):
    """An AttrSchema check for lists: `item_check` (item -> None or a complaint) on every item."""
    def check(values):
        for item in values:
            flaw = item_check(item)
            if flaw:
                return f"has {item!r}: {flaw}"
        return None
    return check


def _format_value(value) -> str:
    """An attribute value as it appears in a target string (booleans as 1/0)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


class Target:
    """A kind ("cuda", "cpu", "cutlass", ...) and its attributes, all of them set (the
    ones not given take the schema's default)."""

    def __init__(self, spec, **attrs):
        if isinstance(spec, Target):
            kind, given = spec.kind, {**spec.explicit_attrs(), **attrs}
        elif isinstance(spec, dict):
            spec = dict(spec)
            if "kind" not in spec:
                raise ConfigError(f"target {spec}: has no 'kind'; known kinds: {', '.join(sorted(TARGET_KINDS))}")
            kind = spec.pop("kind")
            given = {**spec, **attrs}
        elif isinstance(spec, str):
            kind, given = self._parse(spec)
            given.update(attrs)
        else:
            raise ConfigError(f"target must be a string, dict or Target, got {type(spec).__name__}")
        if kind not in TARGET_KINDS:
            raise ConfigError(f"unknown target kind {kind!r}; known kinds: "
                              f"{', '.join(sorted(TARGET_KINDS))}{_did_you_mean(str(kind), TARGET_KINDS)}")
        schema = TARGET_KINDS[kind]
        values = {}
        for name, value in given.items():
            key = str(name).replace("-", "_")
            if key not in schema:
                raise ConfigError(f"target {kind}: unknown attribute {name!r}; "
                                  f"allowed: {', '.join(sorted(schema)) or '(none)'}{_did_you_mean(key, schema)}")
            values[key] = _convert(kind, key, schema[key], value)
        self.kind = kind
        self.attrs = {name: values.get(name, attr.default) for name, attr in schema.items()}
        self._explicit = set(values)  # printed by str(); defaults stay implicit
        self._tokens = []  # one per `with target:` currently open (they may nest)
        self.device = None  # for backend targets: the device target they compile for

    @staticmethod
    def _parse(text: str):
        try:
            parts = shlex.split(text)
        except ValueError as error:
            raise ConfigError(f"target {text!r}: {error}") from None
        if not parts:
            raise ConfigError("empty target string; expected e.g. 'cpu' or 'cuda -arch=sm_90'")
        kind, attrs = parts[0], {}
        for part in parts[1:]:
            if not part.startswith("-") or "=" not in part:
                raise ConfigError(f"target {text!r}: {part!r} is not of the form -name=value")
            name, value = part.lstrip("-").split("=", 1)
            attrs[name] = value
        return kind, attrs

    def explicit_attrs(self) -> dict:
        """The attributes that were given (not defaulted)."""
        return {name: self.attrs[name] for name in self._explicit}

    def __getattr__(self, name):
        attrs = self.__dict__.get("attrs", {})
        if name in attrs:
            return attrs[name]
        raise AttributeError(f"target {self.__dict__.get('kind', '?')} has no attribute {name!r}")

    def __str__(self):
        parts = [self.kind] + [f"-{name}={_format_value(self.attrs[name])}" for name in sorted(self._explicit)]
        return " ".join(shlex.quote(part) for part in parts)

    def __repr__(self):
        return f"Target({str(self)!r})"

    def __eq__(self, other):
        # Equal when every attribute agrees, given or defaulted: "cuda" == "cuda -arch=sm_90".
        return isinstance(other, Target) and self.kind == other.kind and self.attrs == other.attrs

    def __hash__(self):
        return hash((self.kind, tuple((name, _format_value(value)) for name, value in sorted(self.attrs.items()))))

    # ---- the current target -------------------------------------------------------------
    def __enter__(self):
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, *exc):
        _current.reset(self._tokens.pop())
        return False

    @staticmethod
    def current() -> Target | None:
        """The innermost target entered with `with target:`, or None."""
        return _current.get()

    # ---- compiler flags, derived from attributes only -----------------------------------
    def arch_number(self) -> int:
        """90 for sm_90 and sm_90a."""
        return int("".join(ch for ch in self.attrs["arch"] if ch.isdigit()))

    def nvcc_flags(self) -> list[str]:
        if self.kind != "cuda":
            raise ConfigError(f"target {self}: nvcc flags come from a cuda target, not {self.kind!r}")
        arch = self.attrs["arch"]
        number = self.arch_number()
        suffix = "a" if arch.endswith("a") else ""  # sm_90a: the arch-specific features (wgmma, TMA)
        code = f"[sm_{number},compute_{number}]" if self.attrs.get("ptx") and not suffix else f"sm_{number}{suffix}"
        flags = [f"-gencode=arch=compute_{number}{suffix},code={code}",
                 f"-O{self.attrs['opt_level']}", "-std=c++17", "--expt-relaxed-constexpr",
                 # The objects go into a shared library whose only exports are the C ABI.
                 "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden"]
        if self.attrs["use_fast_math"]:
            flags.append("--use_fast_math")
        if self.attrs["debug"]:
            flags += ["-g", "-lineinfo"]
        if self.attrs.get("pdl", True) and number >= 90:
            # the shim's launch_after_previous sets the PDL attribute (backends/builtin/shim/cuda/pdl.cuh):
            # right only for objects of this arch alone, whose kernels all wait (griddepcontrol.wait)
            flags.append("-DBYOC_PDL")
        return flags

    def cxx_flags(self) -> list[str]:
        """Host C++ flags: for cpu kernels, and for the host code of a cuda model."""
        level = self.attrs.get("opt_level", 2)
        flags = [f"-O{level}", "-std=c++17", "-fPIC", "-fvisibility=hidden"]
        if self.kind == "cpu" and self.attrs.get("march"):
            flags.append(f"-march={self.attrs['march']}")
        if self.attrs.get("debug"):
            flags.append("-g")
        return flags


# ---- the visible GPU ------------------------------------------------------------------------

def _nvidia_smi_first_gpu(field: str) -> str | None:
    """`nvidia-smi --query-gpu=FIELD` for GPU 0, or None without nvidia-smi or a GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        run = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = run.stdout.strip().splitlines() if run.returncode == 0 else []
    return (lines[0].strip() or None) if lines else None


def _arch_from_nvidia_smi() -> str | None:
    capability = _nvidia_smi_first_gpu("compute_cap")
    try:
        major, minor = capability.split(".") if capability else (None, None)
        return f"sm_{int(major)}{int(minor)}" if capability else None
    except ValueError:
        return None


def _arch_from_cupy() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return f"sm_{cupy.cuda.Device(0).compute_capability}"  # compute_capability is "90"
    except Exception:  # noqa: BLE001 - no driver, no device: all mean "no GPU here"
        return None


@functools.lru_cache(maxsize=None)
def visible_gpu_name() -> str | None:
    """The product name of GPU 0 ("NVIDIA H100 80GB HBM3"), or None without nvidia-smi or
    a GPU: the device a tuning measurement was made on."""
    return _nvidia_smi_first_gpu("name")


@functools.lru_cache(maxsize=None)
def visible_gpu_arch() -> str | None:
    """The arch of GPU 0 (e.g. "sm_90"), or None when no GPU is visible. Asked once per
    process: nvidia-smi first, then cupy."""
    return _arch_from_nvidia_smi() or _arch_from_cupy()


def auto_device_target() -> Target:
    """cuda for the visible GPU's arch, else cpu."""
    arch = visible_gpu_arch()
    if arch is None:
        return Target("cpu")
    if arch not in CUDA_ARCHES:
        raise ConfigError(f"target auto: the visible GPU is {arch}, which byoc does not compile for "
                          f"(supported: {', '.join(CUDA_ARCHES)}); use target: cpu")
    return Target("cuda", arch=arch)


def resolve_device_target(device: str | None) -> Target:
    """A config's `target` as the build's device Target: 'auto' (or none) is the visible
    GPU's, else the cpu; anything but a cpu or cuda target is a ConfigError."""
    target = auto_device_target() if device in (None, "auto") else Target(device)
    if target.kind not in ("cpu", "cuda"):
        raise ConfigError(f"target: {target} is not a device target; expected 'cpu', 'cuda -arch=sm_XX' or 'auto'")
    return target
