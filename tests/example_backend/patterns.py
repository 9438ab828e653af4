"""The example backend's pattern table, larger pattern first: add followed by relu, then
relu alone. Each check returns None to accept a match, or why it refuses it (the partition
report shows the reason, and the ops go to the next backend)."""
from byoc.backend import PatternEntry
from byoc.ir.expr import Constant
from byoc.pattern import is_op, wildcard


def is_argument(value) -> bool:
    """Whether a matched input becomes a parameter of the composite function: FuseOpsByPattern
    keeps one-element constants inside its body, where these kernels do not look."""
    return not (isinstance(value, Constant) and value.type.size == 1)


def check_float32(match):
    dtype = match.output.type.dtype
    return None if dtype == "float32" else f"dtype {dtype} (the example kernels are float32 loops)"


def check_add_relu(match):
    x, bias = match["x"], match["bias"]
    output = match.output.type.shape
    if x.type.shape != output:
        return f"x has shape {x.type.shape}, not the output's {output} (the kernel broadcasts the bias only)"
    if bias.type.shape not in (output, output[-1:]):
        return f"bias of shape {bias.type.shape} is neither the output's shape nor its last axis {output[-1:]}"
    if x is bias or not (is_argument(x) and is_argument(bias)):
        return "x and bias are not two arguments (add(x, x), or a one-element constant)"
    return check_float32(match)


def pattern_table() -> list:
    add_relu = is_op("relu")(is_op("add")(wildcard().named("x"), wildcard().named("bias")))
    relu = is_op("relu")(wildcard().named("x"))
    return [PatternEntry("add_relu", add_relu, check_add_relu), PatternEntry("relu", relu, check_float32)]
