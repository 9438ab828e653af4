"""RunCodegen: one codegen call per backend, IRModule at a time.

Groups the module's Compiler globals by backend and calls each backend's codegen once
with all of them (symbol -> Function) while that backend's Target is current. Afterwards
every Compiler global must be implemented by some returned Artifact; one that is not is a
BuildError naming it. Rewrites nothing: returns the module unchanged with the artifacts.
"""
from __future__ import annotations

from ..errors import BuildError
from ..ir.module import IRModule


def run_codegen(mod: IRModule, targets: dict) -> tuple[IRModule, list]:
    from ..backend import codegen_target, get_backend
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
            produced = backend.codegen(by_backend[backend_name], target)
        artifacts.extend(produced)
    implemented = {symbol for artifact in artifacts for symbol in artifact.symbols}
    missing = [name for functions in by_backend.values() for name in functions if name not in implemented]
    if missing:
        raise BuildError(f"no backend artifact implements extern function(s) {', '.join(sorted(missing))}")
    return mod, artifacts
