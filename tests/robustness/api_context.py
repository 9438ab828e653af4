"""What the API misuse scenarios share: the library under test (`Context`), the
scenario registry and the exception that marks a wrong answer."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from . import libraries
from .runner import case_dir


class Wrong(Exception):
    """An answer that is not the reference's (the case is `wrong`)."""


class Context:
    def __init__(self, library: dict):
        self.library = library
        self.kind = library["kind"]
        self.device = library["device"]
        self.path = library["path"]
        self.tolerance = library["tolerance"]
        if self.kind == "multi":
            self.inputs = libraries.multi_inputs()
            self.expected = libraries.multi_reference(**self.inputs)
        else:
            self.inputs, self.expected = libraries.mlp_inputs()
        self.inputs = libraries.as_model_dtypes(self.inputs, library["metadata"])
        self._module = None
        self.module_closed_on_purpose = False

    # ---- arrays on the library's device ----
    @property
    def xp(self):
        if self.device == "cuda":
            import cupy
            return cupy
        return np

    def array(self, value):
        return self.xp.asarray(value) if self.device == "cuda" else np.asarray(value)

    def host(self, value):
        if self.device == "cuda" and not isinstance(value, np.ndarray):
            if type(value).__module__.startswith("torch"):
                return value.detach().cpu().numpy()
            import cupy
            return cupy.asnumpy(value)
        return np.asarray(value)

    def good_inputs(self) -> dict:
        return {name: self.array(value) for name, value in self.inputs.items()}

    def synchronize(self):
        if self.device == "cuda":
            import cupy
            cupy.cuda.runtime.deviceSynchronize()

    # ---- the library ----
    def load(self, path=None, **kwargs):
        import byoc
        if path is None and self.kind == "sidecar" and "weights_path" not in kwargs:
            kwargs["weights_path"] = self.library["sidecar"]
        return byoc.load(self.path if path is None else path, **kwargs)

    @property
    def module(self):
        if self._module is None:
            self._module = self.load()
        return self._module

    def copy_library(self, name="copy.so") -> Path:
        destination = case_dir() / name
        shutil.copyfile(self.path, destination)
        if self.kind == "sidecar":
            shutil.copyfile(self.library["sidecar"], destination.with_suffix(".safetensors"))
        return destination

    # ---- checking answers ----
    def reference(self, **inputs) -> list:
        """The reference for other inputs: NumPy for multi, the interpreter for mlp."""
        if self.kind == "multi":
            return libraries.multi_reference(**inputs)
        import byoc
        module = byoc.from_onnx(libraries.FIXTURES / "mlp.onnx")
        result = byoc.interpret(module, **{k: np.asarray(v).astype(np.float32) for k, v in inputs.items()})
        return [result]

    def check(self, outputs, expected=None, what="outputs"):
        expected = self.expected if expected is None else expected
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        self.synchronize()
        if len(outputs) != len(expected):
            raise Wrong(f"{what}: {len(outputs)} arrays, expected {len(expected)}")
        for index, (got, want) in enumerate(zip(outputs, expected)):
            got = self.host(got)
            if got.shape != want.shape:
                raise Wrong(f"{what}[{index}]: shape {got.shape}, expected {want.shape}")
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            error = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
            if not error <= self.tolerance * scale:
                raise Wrong(f"{what}[{index}]: max abs error {error:.3g} (tolerance {self.tolerance * scale:.3g})")

    def still_usable(self) -> str:
        """'' when the module (if one was loaded and not closed on purpose) still answers right."""
        if self._module is None or self.module_closed_on_purpose:
            return ""
        try:
            self.check(self._module.run(**self.good_inputs()), what="a good run after the refusal")
        except Wrong as wrong:
            return str(wrong)
        except Exception as error:  # noqa: BLE001
            return f"a good run after the refusal raised {type(error).__name__}: {error}"
        return ""


SCENARIOS: dict[str, tuple] = {}
ALL_KINDS, CPU, CUDA, BOTH = ("mlp", "multi", "sidecar"), ("cpu",), ("cuda",), ("cpu", "cuda")


def scenario(name, kinds=("mlp",), devices=BOTH, group=None, expect="any"):
    """Register a scenario; its group in the report is `group` or the name's first word.
    expect="accept": a positive control (valid use that must answer right)."""
    def register(function):
        SCENARIOS[name] = (function, kinds, devices, group or name.split(" ")[0].rstrip("="), expect)
        return function
    return register


def _first_name(ctx):
    return next(iter(ctx.inputs))


def _run_with_first(ctx, value):
    """Run with the first input replaced; accepted, the answer must be the reference's
    for the same values (as the model's dtype)."""
    inputs = ctx.good_inputs()
    name = _first_name(ctx)
    inputs[name] = value
    outputs = ctx.module.run(**inputs)
    host = dict(ctx.inputs)
    try:
        host[name] = np.asarray(ctx.host(value)).astype(ctx.inputs[name].dtype)
    except Exception:  # noqa: BLE001 - a value NumPy cannot convert: any answer is wrong
        raise Wrong(f"accepted input {name!r} of type {type(value).__name__} that has no numeric value") from None
    if host[name].shape != ctx.inputs[name].shape:
        raise Wrong(f"accepted input {name!r} of shape {host[name].shape}; the model takes "
                    f"{ctx.inputs[name].shape}")
    ctx.check(outputs, ctx.reference(**host), what="outputs for a converted input")
