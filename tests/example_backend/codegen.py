"""The example backend's codegen: every partition of the build becomes one C++ function,
rendered from kernels.cc.j2 into one source file that the toolchain compiles with the
device target's host flags and links into the model's library."""
import math
from pathlib import Path

import jinja2

from byoc.backend import Artifact
from byoc.ir.expr import Call, Function
from byoc.toolchain import CompileUnit

TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                               undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def composite_of(function: Function):
    """A partition's composite function, and for each of its parameters the number of the
    partition's argument that feeds it. A partition holds one composite (the backend is
    registered with one_composite_per_function) and calls it with its own parameters."""
    (definition,) = [binding for binding in function.bindings if isinstance(binding.value, Function)]
    (call,) = [binding.value for binding in function.bindings
               if isinstance(binding.value, Call) and binding.value.op is definition.var]
    composite = definition.value
    return composite, {param: function.params.index(arg) for param, arg in zip(composite.params, call.args)}


def kernel_of(symbol: str, function: Function) -> dict:
    """What the template needs for one partition: its symbol, which arguments are x and the
    bias, and how many elements they have (shapes are static: a program per shape)."""
    composite, argument_of = composite_of(function)
    ops = {binding.value.op.name: binding.value for binding in composite.bindings}
    kernel = {"symbol": symbol, "elements": math.prod(function.ret_type.shape), "bias": None}
    if "add" in ops:
        x, bias = ops["add"].args
        kernel.update(bias=argument_of[bias], bias_elements=bias.type.size)
    else:
        x = ops["relu"].args[0]
    kernel["x"] = argument_of[x]
    return kernel


def codegen(functions: dict, target) -> list:
    """All of the build's example partitions ({symbol: Function}) -> one Artifact: the source
    with their functions, compiled for the build's device target (target.device)."""
    kernels = [kernel_of(symbol, function) for symbol, function in functions.items()]
    source = Path(target.workdir) / "example.cc"
    source.write_text(TEMPLATES.get_template("kernels.cc.j2").render(kernels=kernels, unroll=target.attrs["unroll"]))
    unit = CompileUnit(source, "cxx", target.device.cxx_flags(), "example.o")
    return [Artifact(backend="example", kind="source", symbols=list(functions), compile_units=[unit])]
