"""Targets: a kind plus typed attributes, for devices ("cuda", "cpu") and for each
backend's external codegen ("cutlass", "cublaslt", "builtin").

    Target("cuda -arch=sm_90")            Target("cuda", arch="sm_90")
    Target({"kind": "cutlass", "sm": 90, "use_fast_math": True})

Compiler flags come only from targets (`nvcc_flags()`, `cxx_flags()`), so a build never
asks the user for options at link time. Backends add their kinds with
`register_target_kind`. `with target:` makes it current for codegen (`Target.current()`).
"""
from __future__ import annotations

import contextvars
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from .errors import ConfigError

CUDA_ARCHES = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_120")


@dataclass(frozen=True)
class AttrSchema:
    type: type  # bool, int, str, float, list
    default: object = None
    allowed: tuple | None = None
    doc: str = ""


TARGET_KINDS: dict[str, dict[str, AttrSchema]] = {
    "cuda": {
        "arch": AttrSchema(str, "sm_90", CUDA_ARCHES, "GPU architecture the code is compiled for"),
        "opt_level": AttrSchema(int, 3, (0, 1, 2, 3), "-O level for nvcc and the host compiler"),
        "use_fast_math": AttrSchema(bool, False, None, "nvcc --use_fast_math"),
        "debug": AttrSchema(bool, False, None, "-g -lineinfo"),
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
    TARGET_KINDS[kind] = dict(attrs)


def _convert(kind: str, name: str, schema: AttrSchema, value):
    def fail():
        allowed = f"; allowed: {', '.join(map(str, schema.allowed))}" if schema.allowed else ""
        raise ConfigError(f"target {kind}: attribute {name}={value!r} is not a {schema.type.__name__}{allowed}")
    if schema.type is bool:
        if isinstance(value, bool):
            converted = value
        elif isinstance(value, (int, str)) and str(value).lower() in ("0", "1", "true", "false"):
            converted = str(value).lower() in ("1", "true")
        else:
            fail()
    elif schema.type is int:
        try:
            converted = int(value)
        except (TypeError, ValueError):
            fail()
        if isinstance(value, bool) or (isinstance(value, float) and value != int(value)):
            fail()
    elif schema.type is float:
        try:
            converted = float(value)
        except (TypeError, ValueError):
            fail()
    elif schema.type is list:
        if isinstance(value, str):
            converted = [v for v in value.split(",") if v]
        elif isinstance(value, (list, tuple)):
            converted = list(value)
        else:
            fail()
    else:
        converted = str(value)
    if schema.allowed is not None and converted not in schema.allowed:
        fail()
    return converted


class Target:
    def __init__(self, spec, **attrs):
        if isinstance(spec, Target):
            kind, given = spec.kind, {**spec.attrs, **attrs}
        elif isinstance(spec, dict):
            spec = dict(spec)
            if "kind" not in spec:
                raise ConfigError(f"target {spec}: has no 'kind'; known kinds: {', '.join(TARGET_KINDS)}")
            kind = spec.pop("kind")
            given = {**spec, **attrs}
        elif isinstance(spec, str):
            kind, given = self._parse(spec)
            given.update(attrs)
        else:
            raise ConfigError(f"target must be a string, dict or Target, got {type(spec).__name__}")
        if kind not in TARGET_KINDS:
            raise ConfigError(f"unknown target kind {kind!r}; known kinds: {', '.join(sorted(TARGET_KINDS))}")
        schema = TARGET_KINDS[kind]
        values = {}
        for name, value in given.items():
            key = name.replace("-", "_")
            if key not in schema:
                raise ConfigError(f"target {kind}: unknown attribute {name!r}; "
                                  f"allowed: {', '.join(sorted(schema)) or '(none)'}")
            values[key] = _convert(kind, key, schema[key], value)
        self.kind = kind
        self.attrs = {name: values.get(name, s.default) for name, s in schema.items()}
        self._explicit = set(values)
        self.device = None  # for backend targets: the device target they compile for

    @staticmethod
    def _parse(text: str):
        parts = shlex.split(text)
        if not parts:
            raise ConfigError("empty target string")
        kind, attrs = parts[0], {}
        for part in parts[1:]:
            if not part.startswith("-") or "=" not in part:
                raise ConfigError(f"target {text!r}: {part!r} is not of the form -name=value")
            name, value = part.lstrip("-").split("=", 1)
            attrs[name] = value
        return kind, attrs

    def __getattr__(self, name):
        attrs = self.__dict__.get("attrs", {})
        if name in attrs:
            return attrs[name]
        raise AttributeError(name)

    def __str__(self):
        parts = [self.kind]
        for name in sorted(self._explicit):
            value = self.attrs[name]
            if isinstance(value, bool):
                value = int(value)
            elif isinstance(value, list):
                value = ",".join(map(str, value))
            parts.append(f"-{name}={value}")
        return " ".join(shlex.quote(p) for p in parts)

    def __repr__(self):
        return f"Target({str(self)!r})"

    def __eq__(self, other):
        return isinstance(other, Target) and self.kind == other.kind and self.attrs == other.attrs

    def __hash__(self):
        return hash((self.kind, str(self)))

    # ---- current target -----------------------------------------------------------------
    def __enter__(self):
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc):
        _current.reset(self._token)
        return False

    @staticmethod
    def current():
        return _current.get()

    # ---- compiler flags, derived from attributes only ---------------------------------
    def arch_number(self) -> int:
        return int("".join(ch for ch in self.attrs["arch"] if ch.isdigit()))

    def nvcc_flags(self) -> list[str]:
        if self.kind != "cuda":
            raise ConfigError(f"target {self} is not a cuda target")
        arch = self.attrs["arch"]
        number = "".join(ch for ch in arch if ch.isdigit())
        suffix = "a" if arch.endswith("a") else ""
        flags = [f"-gencode=arch=compute_{number}{suffix},code=sm_{number}{suffix}",
                 f"-O{self.attrs['opt_level']}", "-std=c++17", "--expt-relaxed-constexpr",
                 "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden"]
        if self.attrs["use_fast_math"]:
            flags.append("--use_fast_math")
        if self.attrs["debug"]:
            flags += ["-g", "-lineinfo"]
        return flags

    def cxx_flags(self) -> list[str]:
        level = self.attrs.get("opt_level", 2)
        flags = [f"-O{level}", "-std=c++17", "-fPIC", "-fvisibility=hidden"]
        if self.kind == "cpu" and self.attrs.get("march"):
            flags.append(f"-march={self.attrs['march']}")
        if self.attrs.get("debug"):
            flags.append("-g")
        return flags


def visible_gpu_arch() -> str | None:
    """The arch of GPU 0 (e.g. "sm_90"), or None when no GPU is visible."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
            if line:
                major, minor = line.strip().split(".")
                return f"sm_{major}{minor}"
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass
    return None


def auto_device_target() -> Target:
    """cuda for the visible GPU's arch, else cpu."""
    arch = visible_gpu_arch()
    return Target("cuda", arch=arch) if arch else Target("cpu")
