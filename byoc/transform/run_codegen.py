"""RunCodegen: one codegen call per backend, IRModule at a time.

Groups the module's Compiler globals by backend and calls each backend's codegen once
with all of them (`{symbol: Function}`, the symbol being the global's name) while that
backend's Target is current (`byoc.backend.current_target()`). Afterwards every Compiler
global, and every extern declaration (Extern=1) already in the module, must be
implemented by some returned Artifact (listed in its `symbols`); one that is not is a
BuildError naming it. Rewrites nothing: returns the module unchanged, with the artifacts.
"""
from __future__ import annotations

from ..errors import BuildError
from ..ir.module import IRModule


def run_codegen(mod: IRModule, targets: dict | None = None) -> tuple[IRModule, list]:
    """`targets`: backend name -> its Target (any object; None or missing means none)."""
    from ..backend import Artifact, codegen_target, get_backend
    targets = targets or {}
    by_backend: dict[str, dict] = {}
    for name, function in mod.functions.items():
        backend = function.attrs.get("Compiler")
        if backend is not None:
            by_backend.setdefault(str(backend), {})[name] = function
    artifacts = []
    for backend_name in sorted(by_backend):
        backend = get_backend(backend_name)
        target = targets.get(backend_name)
        with codegen_target(target):
            produced = list(backend.codegen(by_backend[backend_name], target) or [])
        for artifact in produced:
            if not isinstance(artifact, Artifact):
                raise BuildError(f"the codegen of backend {backend_name!r} returned {artifact!r}; "
                                 f"expected byoc.backend.Artifact objects")
        artifacts.extend(produced)

    implemented = {symbol for artifact in artifacts for symbol in artifact.symbols}
    needed = {name: str(function.attrs["Compiler"]) for functions in by_backend.values()
              for name, function in functions.items()}
    needed.update({name: "extern declaration" for name, function in mod.functions.items()
                   if function.attrs.get("Extern") and name not in needed})
    missing = sorted(name for name in needed if name not in implemented)
    if missing:
        described = ", ".join(f"{name} ({needed[name]})" for name in missing)
        raise BuildError(f"no artifact implements extern function(s) {described}: each backend's codegen "
                         f"must list every symbol it was given in Artifact.symbols")
    return mod, artifacts
