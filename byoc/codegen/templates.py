"""Renders the Jinja templates shipped in templates/ (installed as byoc.templates).

Templates receive plain data (dicts, lists, strings, numbers) and hold no logic beyond
loops and conditionals; undefined variables are errors, not empty strings."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2


@functools.lru_cache(maxsize=1)
def template_environment() -> jinja2.Environment:
    import byoc.templates
    root = Path(byoc.templates.__file__).parent
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(root)), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              # HTML pages escape what they show (names come from models); C/C++
                              # sources get names already sanitized for C
                              autoescape=lambda name: name is not None and ".html" in name)


def render_template(name: str, data: dict) -> str:
    """Render templates/<name> with `data`."""
    return template_environment().get_template(name).render(**data)
