"""Passes over the IR: each is a plain function IRModule -> IRModule (options are
arguments), one pass per file, run in the order the pipeline in DESIGN.md gives."""
from .fold_constant import fold_constant
from .dead_code_elimination import dead_code_elimination
from .convert_to_float16 import convert_to_float16
from .fuse_ops_by_pattern import fuse_ops_by_pattern
from .merge_composite_functions import merge_composite_functions
from .outline_compiler_functions import outline_compiler_functions
from .mark_compiler_functions_as_extern import mark_compiler_functions_as_extern
from .run_codegen import run_codegen
from .partition import partition_for
from .recognize_gelu import recognize_gelu
from .sink_reshapes import sink_reshapes
from .simplify_identity_gather import simplify_identity_gather
from .combine_parallel_matmul import combine_parallel_matmul
from .combine_logit_addends import combine_logit_addends
from .shrink_broadcast_constants import shrink_broadcast_constants
from .rewrite_cuda_graph import rewrite_cuda_graph

from .hoist_scalar_factors import hoist_scalar_factors
from .unflatten_batch_transpose import unflatten_batch_transpose
