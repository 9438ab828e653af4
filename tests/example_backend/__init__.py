"""The example backend of docs/backends.md ("Writing your own backend"): relu, and add
followed by relu, as plain C++ loops on the cpu. Importing this package registers it, as
importing byoc.backends.<name> registers a shipped backend."""
from byoc.backend import register_backend
from byoc.target import AttrSchema, at_least, register_target_kind

from .codegen import codegen
from .patterns import pattern_table

# The backend's Target: the options a config gives it, e.g. `backends: [{example: {unroll: 4}}]`.
register_target_kind("example", {
    "unroll": AttrSchema(int, 1, None, "loop iterations the compiler unrolls (#pragma GCC unroll)",
                         check=at_least(1)),
})

# device="cpu": its functions read and write host memory (in a cuda build PlanDevices copies
# their operands there), so no CUDA graph may capture them. One composite per function keeps
# the codegen simple: a partition is one add_relu or one relu.
register_backend("example", flavor="csource", patterns=pattern_table(), codegen=codegen, device="cpu",
                 capturable=False, one_composite_per_function=True)
