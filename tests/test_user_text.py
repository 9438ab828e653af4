"""byoc.user_text and its users: integers read from ASCII digits only (the command line,
config ranges, target attributes), control characters escaped before a printer shows
untrusted text, and the shape-bucket count checked before the buckets are listed.
tests/robustness/cases_inputs.py runs the same inputs through the commands."""
from __future__ import annotations

import argparse
import time

import pytest

from byoc.cli.common import UsageError, count_argument, parse_dims, parse_input_shapes
from byoc.config import MAX_SHAPE_BUCKETS, BuildConfig, load_config, size_range
from byoc.errors import ConfigError
from byoc.target import Target
from byoc.user_text import INT64_LIMIT, parse_ascii_integer, printable, printable_tree

# what str.isdigit() or int() take that a person does not type as a size
NOT_ASCII_INTEGERS = ["²", "٣", "４", "1_0", "9" * 5000, str(INT64_LIMIT), "0x10", "1e3", "", " ", "+1", "1 2"]


@pytest.mark.parametrize("text", NOT_ASCII_INTEGERS)
def test_integers_are_ascii_digits_within_int64(text):
    assert parse_ascii_integer(text) is None
    assert parse_ascii_integer(text, signed=True) is None


def test_ascii_integers_are_read():
    assert parse_ascii_integer("0") == 0 and parse_ascii_integer(" 42\t") == 42
    assert parse_ascii_integer(str(INT64_LIMIT - 1)) == INT64_LIMIT - 1
    assert parse_ascii_integer("-3") is None and parse_ascii_integer("-3", signed=True) == -3
    assert parse_ascii_integer(str(-INT64_LIMIT), signed=True) == -INT64_LIMIT
    assert parse_ascii_integer(7) is None  # text only: the caller checks other types itself


@pytest.mark.parametrize("text", [t for t in NOT_ASCII_INTEGERS if t.strip()] + ["-1", "1..2²", "1..1" + "0" * 30])
def test_command_line_sizes_refuse_what_is_no_ascii_integer(text):
    with pytest.raises(UsageError, match=r"--dim '.*: expected NAME=SIZE .* in ASCII digits"):
        parse_dims([f"batch={text}"], several=True)
    with pytest.raises(UsageError, match=r"--input-shape '.*: the dims must be non-negative integers in ASCII"):
        parse_input_shapes([f"x={text},8"])
    if text != "-1":  # --repeat -1 is an integer: byoc run's own check refuses it
        with pytest.raises(argparse.ArgumentTypeError, match="is not an integer in ASCII digits"):
            count_argument(text)


def test_command_line_sizes_accept_ascii_integers():
    assert parse_dims(["batch=2", "sequence= 8"]) == {"batch": 2, "sequence": 8}
    assert parse_dims(["batch=1,8, 32", "s=1..8"], several=True) == {"batch": [1, 8, 32], "s": [1, 2, 4, 8]}
    assert parse_input_shapes(["x=2, 8", "scalar="]) == {"x": (2, 8), "scalar": ()}
    assert count_argument("100") == 100 and count_argument("-1") == -1


def test_a_long_argument_is_named_not_repeated_whole():
    with pytest.raises(UsageError) as raised:
        parse_dims(["batch=" + "9" * 5000])
    assert len(str(raised.value)) < 400


def test_config_ranges_and_target_attributes_take_ascii_digits_only():
    assert size_range("1..4") == [1, 2, 4] and size_range("١..٤") == "١..٤"  # Arabic-Indic: no range
    assert size_range("1.." + "9" * 5000) == "1.." + "9" * 5000  # no int() of 5,000 digits
    assert Target("cpu -opt_level=3").attrs["opt_level"] == 3
    for text in ("²", "٣", "1_0", "9" * 5000):
        with pytest.raises(ConfigError, match=r"attribute opt_level=.* is not an integer \(in ASCII digits"):
            Target(f"cpu -opt_level={text}")


def test_bucket_sizes_are_at_least_one_before_anything_is_built():
    with pytest.raises(ConfigError, match=r"dims\.batch: \[0, 4\] is not allowed \(size 0 is not an integer from 1"):
        load_config({"target": "cpu", "dims": {"batch": [0, 4]}})
    assert load_config({"target": "cpu", "dims": {"batch": 0}}).shape_buckets() == [{"batch": 0}]  # one empty program
    assert load_config({"target": "cpu", "dims": {"batch": [1, 4]}}).shape_buckets() == [{"batch": 1}, {"batch": 4}]


def test_the_bucket_count_is_checked_before_the_buckets_are_listed():
    dims = {f"d{i}": [1, 2] for i in range(40)}  # 2**40 combinations
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"make 1099511627776 shape buckets; expected at most {MAX_SHAPE_BUCKETS}"):
        load_config({"target": "cpu", "dims": dims})
    # a BuildConfig made without validate (dataclasses.replace) is checked the same way
    with pytest.raises(ConfigError, match="make 1099511627776 shape buckets"):
        BuildConfig(dims=dims).shape_buckets()
    with pytest.raises(ConfigError, match=r"\(d0: 2, .*, and 99992 more dims\) make more than 1e\+18 shape buckets"):
        BuildConfig(dims={f"d{i}": [1, 2] for i in range(100000)}).shape_buckets()
    assert time.monotonic() - started < 5
    assert len(BuildConfig(dims={f"d{i}": [1, 2] for i in range(4)}).shape_buckets()) == MAX_SHAPE_BUCKETS


def test_printable_escapes_what_a_terminal_acts_on():
    assert printable("input_ids: float32 [batch, 128] µ名") == "input_ids: float32 [batch, 128] µ名"
    assert printable("x\x1b[2J\x07") == "x\\x1b[2J\\x07"
    assert printable("a\nb\rc\td\x7f") == "a\\x0ab\\x0dc\\x09d\\x7f"
    assert printable("\x9b31m") == "\\x9b31m"  # C1 CSI: one byte that starts a sequence on some terminals
    assert printable("abc\u202edef\u2066") == "abc\\u202edef\\u2066"  # bidi override and isolate
    assert printable("line\u2028break") == "line\\u2028break"
    assert printable(3.5) == "3.5"
    tree = printable_tree({"na\x1bme": ["\x1b[31m", 4, None, {"k": ("\x07",)}]})
    assert tree == {"na\\x1bme": ["\\x1b[31m", 4, None, {"k": ("\\x07",)}]}
