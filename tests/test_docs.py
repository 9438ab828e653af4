"""The documentation says what the code does: README.md and docs/*.md checked against it.

- Every ```python block runs, each in its own process, a page's blocks in order in one
  temporary directory (a later block may use what an earlier one built). The directory has
  a link `tests` to the repository's tests/, so blocks name fixtures as from the repository
  root (`tests/fixtures/bert2.onnx`) and write their builds where they run.
- Every ```c block compiles against the runtime's headers and runs in that directory.
- An excerpt block (its first line a comment naming a file under tests/example_backend/,
  as in docs/backends.md) is not run: its text must be in that file, so the backend guide
  shows the example backend's real code.
- Every `byoc ...` line of a ```sh block names a subcommand and options it has (`--help`).
- The operator lists of docs/models.md are the code's; relative links lead to files.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
PAGES = [REPOSITORY / "README.md"] + sorted((REPOSITORY / "docs").glob("*.md"))
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
EXCERPT = re.compile(r"(?:#|//|\{#)\s*(tests/example_backend/[\w./]+)(?:\s*#\})?")
BLOCK_TIMEOUT_S = 600  # a cold object cache compiles the runtime first


def blocks(page: Path, language: str) -> list:
    return [text for kind, text in BLOCK.findall(page.read_text()) if kind == language]


def excerpt_source(text: str):
    """The example backend's file an excerpt block quotes (its first line names it), or None."""
    match = EXCERPT.fullmatch(text.splitlines()[0].strip()) if text.strip() else None
    return REPOSITORY / match.group(1) if match else None


def page_id(page: Path) -> str:
    return str(page.relative_to(REPOSITORY))


@pytest.fixture
def page_directory(tmp_path):
    (tmp_path / "tests").symlink_to(REPOSITORY / "tests")
    return tmp_path


def run_block(command: list, directory: Path, what: str):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPOSITORY)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    run = subprocess.run(command, cwd=directory, env=environment, capture_output=True, text=True,
                         timeout=BLOCK_TIMEOUT_S)
    assert run.returncode == 0, f"{what} failed (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_code_blocks_run(page, page_directory):
    python_blocks = [text for text in blocks(page, "python") if excerpt_source(text) is None]
    for number, text in enumerate(python_blocks):
        script = page_directory / f"block{number}.py"
        script.write_text(text)
        run_block([sys.executable, script.name], page_directory, f"{page_id(page)}, python block {number}:\n{text}")
    from byoc.runtime import INCLUDE_DIR
    for number, text in enumerate(blocks(page, "c")):
        source = page_directory / f"block{number}.c"
        source.write_text(text)
        run_block(["cc", "-std=c11", f"-I{INCLUDE_DIR}", source.name, "-o", source.stem, "-ldl", "-lm"], page_directory,
                  f"compiling {page_id(page)}, c block {number}")
        run_block([f"./{source.stem}"], page_directory, f"{page_id(page)}, c block {number}:\n{text}")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_excerpts_are_the_example_backends_code(page):
    for language in ("python", "cpp", "jinja"):
        for text in blocks(page, language):
            source = excerpt_source(text)
            if source is not None:
                quoted = text.split("\n", 1)[1] if "\n" in text else ""
                assert quoted.strip() and quoted in source.read_text(), \
                    f"{page_id(page)} quotes {source.relative_to(REPOSITORY)}, which does not contain:\n{quoted}"


def byoc_help(subcommand: str) -> str:
    run = subprocess.run([sys.executable, "-m", "byoc", subcommand, "--help"], cwd=REPOSITORY,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"`byoc {subcommand} --help` failed: {run.stderr}"
    return run.stdout


def byoc_command_lines(page: Path) -> list:
    """The `byoc ...` commands of a page's sh blocks, each as its words up to the first
    shell operator or comment."""
    commands = []
    for text in blocks(page, "sh"):
        for line in text.splitlines():
            for command in re.split(r"\s(?:&&|\|\||;)\s", line.split(" #")[0]):
                if command.strip().split(" ")[0] == "byoc":
                    words = shlex.split(command.replace("|", " | "))
                    commands.append(words[:words.index("|")] if "|" in words else words)
    return commands


@pytest.mark.parametrize("page", [p for p in PAGES if byoc_command_lines(p)], ids=page_id)
def test_shell_commands_use_options_byoc_has(page):
    helps = {}
    for words in byoc_command_lines(page):
        subcommand = words[1] if len(words) > 1 else "--help"
        if subcommand.startswith("-"):
            continue  # `byoc --version`, `byoc --help`: the main parser's own
        if subcommand not in helps:
            helps[subcommand] = byoc_help(subcommand)
        for word in words[2:]:
            option = word.strip("[]").split("=")[0]
            if option.startswith("-") and option != "-":
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", helps[subcommand]), \
                    f"{page_id(page)}: `{shlex.join(words)}`: byoc {subcommand} has no option {option}"


def listed_names(page: Path, heading: str) -> tuple:
    """(the count in `### <heading> (N)`, the comma-separated names in the paragraph after it)."""
    match = re.search(rf"^### {re.escape(heading)} \((\d+)\)\n\n(.+?)\n\n", page.read_text(), re.MULTILINE | re.DOTALL)
    assert match, f"{page_id(page)} has no section '### {heading} (N)'"
    return int(match.group(1)), [name.strip() for name in match.group(2).replace("\n", " ").split(",")]


def test_operator_lists_are_the_codes():
    from byoc.frontend import SUPPORTED_OPS
    from byoc.ir import list_ops
    page = REPOSITORY / "docs" / "models.md"
    count, names = listed_names(page, "ONNX op types")
    assert names == sorted(SUPPORTED_OPS) and count == len(names)
    count, names = listed_names(page, "IR ops")
    # on_device and device_copy are PlanDevices' annotations, not ops a model computes with
    assert names == [op for op in list_ops() if op not in ("on_device", "device_copy")] and count == len(names)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_lead_to_files(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if not re.match(r"\w+://|mailto:", target):
            assert (page.parent / target).exists(), f"{page_id(page)} links to {target}, which does not exist"


def test_readme_reads_in_five_minutes():
    assert len((REPOSITORY / "README.md").read_text().splitlines()) < 120


def test_target_attribute_tables_are_the_schemas():
    """docs/configuration.md's table of each target kind lists exactly its attributes."""
    import byoc.backends.builtin  # noqa: F401 - importing a backend registers its target kind
    import byoc.backends.cublaslt  # noqa: F401
    import byoc.backends.cudnn  # noqa: F401
    import byoc.backends.cutlass  # noqa: F401
    from byoc.target import TARGET_KINDS
    text = (REPOSITORY / "docs" / "configuration.md").read_text()
    for kind in ("cuda", "cpu", "cutlass", "cudnn", "cublaslt", "builtin"):
        match = re.search(rf"^### Target `{kind}` \((\d+)\)\n\n(.*?)(?:\n\n|\Z)", text, re.MULTILINE | re.DOTALL)
        assert match, f"docs/configuration.md has no section '### Target `{kind}` (N)'"
        listed = re.findall(r"^\| `(\w+)` \|", match.group(2), re.MULTILINE)
        assert listed == list(TARGET_KINDS[kind]) and int(match.group(1)) == len(listed), kind
