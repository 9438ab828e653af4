"""IRModule: global functions (defined, or extern declarations) by name."""
from __future__ import annotations

from .expr import Function, GlobalVar


class IRModule:
    def __init__(self, functions: dict[str, Function] | None = None, attrs: dict | None = None):
        self.functions: dict[str, Function] = {}
        self.attrs = dict(attrs or {})
        for name, func in (functions or {}).items():
            self[name] = func

    def __getitem__(self, name: str) -> Function:
        if isinstance(name, GlobalVar):
            name = name.name
        if name not in self.functions:
            raise KeyError(f"IRModule has no global {name!r}; it has {', '.join(self.functions)}")
        return self.functions[name]

    def __setitem__(self, name: str, func: Function):
        if isinstance(name, GlobalVar):
            name = name.name
        if not isinstance(func, Function):
            raise TypeError(f"global {name!r} must be a Function, got {type(func).__name__}")
        self.functions[name] = func

    def __contains__(self, name) -> bool:
        if isinstance(name, GlobalVar):
            name = name.name
        return name in self.functions

    def __delitem__(self, name):
        del self.functions[name if isinstance(name, str) else name.name]

    def __iter__(self):
        return iter(self.functions)

    def items(self):
        return self.functions.items()

    def get_global_var(self, name: str) -> GlobalVar:
        return GlobalVar(name, self[name].type)

    def copy(self) -> "IRModule":
        return IRModule(dict(self.functions), self.attrs)

    def with_attrs(self, **attrs) -> "IRModule":
        """A copy with `attrs` set (the build's stages record what they decide this way)."""
        result = self.copy()
        result.attrs.update(attrs)
        return result

    def with_function(self, name: str, func: Function) -> "IRModule":
        """This module with `name` bound to `func`: itself when that is already so (a pass
        that changed nothing returns its input), else a copy."""
        if self.functions.get(name) is func:
            return self
        result = self.copy()
        result[name] = func
        return result

    def map_bodies(self, rewrite) -> "IRModule":
        """A copy with every function that has a body (not an extern declaration) replaced
        by rewrite(function): how a pass that rewrites each function on its own runs."""
        result = self.copy()
        for name, function in self.functions.items():
            if function.bindings:
                result[name] = rewrite(function)
        return result

    def script(self, **options) -> str:
        from .printer import print_module
        return print_module(self, **options)

    def __str__(self):
        return self.script()

    @staticmethod
    def from_expr(func: Function, name: str = "main") -> "IRModule":
        return IRModule({name: func})
