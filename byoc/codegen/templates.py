"""Renders the Jinja templates shipped in templates/ (installed as byoc.templates).

Templates receive plain data (dicts, lists, strings, numbers) and hold no logic beyond
loops and conditionals; undefined variables are errors, not empty strings."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2


class _TemplateBytecodeCache(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept beside the object cache ($BYOC_CACHE_DIR/jinja, keyed by
    each template's text): compiling the dozen a build renders takes a warm build 0.15 s.
    The directory follows BYOC_CACHE_DIR as it is at each load and store, as the object
    cache's does. A cache that cannot be read or written is no cache (the template
    compiles)."""

    def __init__(self):  # no directory of its own: see `directory`
        self.pattern = "__jinja2_%s.cache"

    @property
    def directory(self) -> str:
        from byoc.toolchain.cache import cache_root
        return str(cache_root() / "jinja")

    def load_bytecode(self, bucket):
        try:
            super().load_bytecode(bucket)
        except Exception:  # noqa: BLE001 - unreadable or corrupt (a pickle error): compile instead
            bucket.reset()

    def dump_bytecode(self, bucket):
        try:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            pass


@functools.lru_cache(maxsize=1)
def template_environment() -> jinja2.Environment:
    import byoc.templates
    root = Path(byoc.templates.__file__).parent
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                              bytecode_cache=_TemplateBytecodeCache(),
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              # HTML pages escape what they show (names come from models); C/C++
                              # sources get names already sanitized for C
                              autoescape=lambda name: name is not None and ".html" in name)


def render_template(name: str, data: dict) -> str:
    """Render templates/<name> with `data`."""
    return template_environment().get_template(name).render(**data)
