"""Passes over the IR: each is a plain function IRModule -> IRModule (options are
arguments), one pass per file, run in the order the pipeline in DESIGN.md gives."""
from .fold_constant import fold_constant
from .dead_code_elimination import dead_code_elimination
from .convert_to_float16 import convert_to_float16
