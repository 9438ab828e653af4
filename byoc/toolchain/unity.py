"""Unity builds: compile units that instantiate mostly the same templates, compiled as one
translation unit.

A CUTLASS kernel's compile time is its template instantiations, not its own lines, and
kernels of one tile and schedule instantiate mostly the same ones. Measured with nvcc 13.0
(2-core development machine, bench/results/nvcc_phases.md "Unity builds"): two sm90 device
halves of one 128x256x64 cooperative tile (epilogues plain and residual + ReLU) take 29 s
and 25 s apart, 30 s as one unit; two host halves 14 s each, 14 s together, eight 21 s.

A backend opts a unit in with CompileUnit.unity, a key naming what its units share (units
are grouped only when the key, the language, the source's suffix and the flags agree), and
writes such sources so that they can be concatenated: distinct names at file scope,
guarded headers. Only units missing from the object cache are grouped, so a unit compiled
alone earlier (by the tuner, or by another model) is taken from the cache as before. A
group's source, <workdir>/unity/unity_<key>_<hash>.<suffix>, #includes its members'; its
object goes to obj/unity/.

What a group compiles to depends on the language:
- cubin: one cubin of every member's kernels, embedded once per member in the member's own
  object under the member's own symbol (a cubin is loaded and its kernel looked up by name
  at run time, so carrying the others' kernels is harmless). Each member's object is then
  cached under the member's own key, as if it had been compiled alone.
- cuda, cxx: one object with every member's code, which the link takes once in place of the
  members' objects, and which the cache keeps under each member's key: a later build that
  needs one of the members takes the whole object. So such members must link where the
  others are absent and beside another copy of themselves: their external definitions weak
  and named after their content, their references to what only they use weak (the CUTLASS
  host halves, templates/cutlass/gemm_sm90.cu.j2).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

# Members of one group at most. A group's compile grows with its members (eight host
# halves take 21 s against 14 s for one), and one unit must not outlast the build's slowest
# other unit (a device half, 25-35 s). Cubin groups stay smaller: each member's object
# carries the whole group's cubin (n members, n * n kernel images in the library; a kernel
# is 30-50 kB), and ptxas assembles every member's kernel in the one job.
UNITY_MAX_MEMBERS = {"cubin": 4}
UNITY_MAX_MEMBERS_DEFAULT = 8

# What a member's path must not contain to be #included by a generated source
_UNQUOTABLE = re.compile(r'["\\\n\r]')


_SWITCH = {"": True, "1": True, "true": True, "on": True, "yes": True,
           "0": False, "false": False, "off": False, "no": False}


def unity_build_enabled() -> bool:
    """False when BYOC_UNITY_BUILD says so (0, false, off, no): every unit compiles alone,
    to compare build times, or to see a compiler error in one unit's own compile. A value
    that is neither on nor off is a BuildError naming the variable."""
    text = os.environ.get("BYOC_UNITY_BUILD", "")
    enabled = _SWITCH.get(text.strip().lower())
    if enabled is None:
        from ..errors import BuildError
        raise BuildError(f"BYOC_UNITY_BUILD={text!r}: expected 1, true, on or yes (unity builds, the default) "
                         "or 0, false, off or no (every unit compiled alone)")
    return enabled


def unity_groups(units: list) -> list[list]:
    """`units` (CompileUnits missing from the cache) partitioned into groups of two or more
    that compile together: equal unity key, language, source suffix (which tells the
    compiler the language) and flags, at most UNITY_MAX_MEMBERS each, sizes as even as
    possible. Membership depends on the members' outputs only, so the same units make the
    same groups in every build. None when unity_build_enabled() is False."""
    if not unity_build_enabled():
        return []
    classes = {}
    for unit in units:
        if unit.unity and not _UNQUOTABLE.search(str(Path(unit.source).resolve())):
            key = (unit.language, unit.unity, Path(unit.source).suffix, tuple(map(str, unit.flags)))
            classes.setdefault(key, []).append(unit)
    groups = []
    for (language, *_), members in sorted(classes.items()):
        members.sort(key=lambda unit: unit.output)
        count = -(-len(members) // UNITY_MAX_MEMBERS.get(language, UNITY_MAX_MEMBERS_DEFAULT))
        size, larger = divmod(len(members), count)
        start = 0
        for index in range(count):
            end = start + size + (index < larger)
            if end - start >= 2:
                groups.append(members[start:end])
            start = end
    return groups


def unity_name(members: list) -> str:
    """The group's file stem: its unity key made a file name, and a hash of its members."""
    readable = re.sub(r"[^A-Za-z0-9_]+", "_", members[0].unity).strip("_")[:80] or "unity"
    digest = hashlib.sha256("\n".join(unit.output for unit in members).encode()).hexdigest()[:10]
    return f"unity_{readable}_{digest}"


def unity_source_text(members: list, directory: Path) -> str:
    """The group's translation unit: each member's source #included by its path relative
    to `directory`, where the unity source lies (inside the work directory: the text does
    not depend on where the build is)."""
    lines = [f"// A unity build of {len(members)} byoc compile units ({unity_name(members)}): one",
             "// translation unit instantiates what they share once (byoc/toolchain/unity.py).", ""]
    for unit in members:
        lines.append(f'#include "{os.path.relpath(Path(unit.source).resolve(), Path(directory).resolve())}"')
    return "\n".join(lines) + "\n"
