"""byoc.json_files: the guarded reader of JSON files users hand byoc (metadata.json, tuning
databases, a library's metadata). Each refusal is the caller's byoc error naming the file;
the limits are checked before the work they guard (no blocking open, no unbounded read, no
recursion). tests/robustness/cases_inputs.py runs the same damage through the commands."""
from __future__ import annotations

import json
import os
import threading

import pytest

from byoc.errors import BuildError, ConfigError
from byoc.json_files import MAX_JSON_DEPTH, MAX_INTEGER_DIGITS, nesting_depth, parse_json, read_json


def _refused(path, match, **kwargs):
    with pytest.raises(ConfigError, match=match) as raised:
        read_json(path, "a build's metadata", **kwargs)
    assert str(path) in str(raised.value) and "cannot read it as a build's metadata" in str(raised.value)


def test_a_valid_file_reads_as_json_does(tmp_path):
    document = {"memory": {"arena_bytes": (1 << 63) - 1, "ratio": 1.5e300}, "name": "x\x1b", "ok": [True, None],
                "deep": json.loads("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1))}  # 64 with the top
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps(document))
    assert read_json(path, "a build's metadata") == document
    link = tmp_path / "link.json"
    link.symlink_to(path)  # a link to a regular file is that file
    assert read_json(link, "a build's metadata") == document


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    path = tmp_path / "metadata.json"
    os.mkfifo(path)
    outcome = []

    def read():
        try:
            outcome.append(read_json(path, "a build's metadata"))
        except ConfigError as error:
            outcome.append(error)
    # a plain open() would block here forever: run it where a hang fails the test, not the run
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "read_json blocked on a FIFO"
    assert isinstance(outcome[0], ConfigError) and "it is a FIFO, not a regular file" in str(outcome[0])


def test_devices_directories_and_missing_files_are_refused_by_name(tmp_path):
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")  # read, it would fill memory
    _refused(zero, "it is a character device, not a regular file")
    _refused(tmp_path, "it is a directory, not a regular file")
    _refused(tmp_path / "missing.json", "No such file or directory")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    _refused(loop, "Too many levels of symbolic links")


def test_size_limit_is_checked_before_parsing(tmp_path):
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    size = path.stat().st_size
    _refused(path, f"it has {size} bytes; expected at most 1000", max_bytes=1000)
    assert read_json(path, "x", max_bytes=size)["pad"] == "x" * 2000  # the limit itself is allowed


@pytest.mark.parametrize("text, says", [
    ("[" * 100000 + "]" * 100000, f"its JSON nests more than {MAX_JSON_DEPTH} levels deep"),
    ('{"a":' * 100000 + "1" + "}" * 100000, "nests more than"),
    ("[" * 100000, "nests more than"),  # unclosed: refused by depth before json.loads recurses
    ('{"arena_bytes": 1' + "0" * 400 + "}", "an integer of 401 digits"),
    ('{"us": -' + "9" * 5000 + "}", "an integer of 5000 digits"),
    ('{"us": 1e400}', "the number 1e400 is not finite"),
    ('{"us": NaN}', "NaN is no number"),
    ('{"us": -Infinity}', "-Infinity is no number"),
    ('{"a": 1,}', r"not valid UTF-8 JSON \(Expecting"),
    (b'{"a": "\xff"}', r"not valid UTF-8 JSON \(invalid start byte at byte 7\)"),
])
def test_damaged_documents_are_refused_naming_the_file(text, says, tmp_path):
    path = tmp_path / "metadata.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    _refused(path, says)


def test_limits_are_exact_and_brackets_in_strings_do_not_nest():
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "f.json", "x") is not None
    with pytest.raises(ConfigError, match="nests more than"):
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "f.json", "x")
    assert parse_json(json.dumps({"name": "[[[{{{" * 1000 + '\\"['}), "f.json", "x")["name"].startswith("[[[")
    assert nesting_depth('["]]]", ["\\"[[["]]', 10) == 2
    largest = "9" * MAX_INTEGER_DIGITS
    assert parse_json(f"[{largest}, -{largest}]", "f.json", "x") == [int(largest), -int(largest)]
    with pytest.raises(ConfigError, match=f"an integer of {MAX_INTEGER_DIGITS + 1} digits"):
        parse_json(f"[{largest}9]", "f.json", "x")


def test_the_callers_error_class_and_advice_carry_through():
    with pytest.raises(BuildError, match=r"db\.json: cannot read it as a tuning database: .*; rebuild it$"):
        parse_json("{", "db.json", "a tuning database", BuildError, advice="rebuild it")
