"""Codegen of the built-in backend (extern-shim flavor): builtin functions -> one source file.

`generate(functions, target_kind)` turns each Compiler="builtin" function into

    extern "C" int <symbol>(void* const* args, void* const* results, void* workspace,
                            size_t workspace_bytes, void* stream);

args: the function's parameters in order; results[0]: its one output; every buffer dense
row-major, device pointers for "cuda" and host pointers for "cpu"; `stream` is a
cudaStream_t (ignored on cpu); `workspace` is scratch of at least the bytes
GeneratedSource.workspace_bytes[symbol] says. It returns 0, or nonzero after calling
`byoc_report_error(symbol, message)` (provided by the runtime; for a shim failure the
message is byoc_shim_last_error()).

Three kinds of bodies:
- a fused elementwise group (every binding an elemwise/broadcast op) becomes a kernel
  rendered from templates/builtin/elementwise.j2 (see elementwise.py);
- a depthwise conv with its elementwise chain (Composite="builtin.conv2d_epilogue") becomes
  the shim's depthwise kernel with a generated epilogue on CUDA, the conv's shim call and
  the chain's loop on the CPU (conv_epilogue.py);
- a concat that reads its parts through views (Composite="builtin.concat_views") is one
  strided copy a part;
- a squeeze-and-excitation block (Composite="builtin.squeeze_excitation") is one call of
  the shim's byoc_shim_squeeze_excitation (squeeze_excitation.py);
- any other function holds one op call, and the table OP_EMITTERS (shim_calls.py) maps
  the op to an emitter that writes calls to the shim (backends/builtin/shim/byoc_shim.h)
  with every size computed at build time and written as a literal.

Names from models never reach the source: symbols must be C identifiers (checked), and
everything else in the file is generated.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...codegen.templates import render_template
from ...errors import BuildError
from ...ir.expr import Function
from ...transform.run_codegen import symbol_name_problem
from .elementwise import elementwise_kernel, is_elementwise_function
from .conv_epilogue import conv_epilogue_cpu, conv_epilogue_cuda
from .partition import CONCAT_VIEWS_COMPOSITE, CONV_EPILOGUE_COMPOSITE, LAYOUT_COMPOSITE
from .shim_calls import emit_concat_views, emit_layout_chain, emit_shim_calls
from .squeeze_excitation import SE_COMPOSITE, emit_squeeze_excitation

TARGET_KINDS = ("cpu", "cuda")
SOURCE_SUFFIXES = {"cpu": ".cc", "cuda": ".cu"}

@dataclass
class GeneratedSource:
    """The generated source of all builtin functions of a module, for one target."""
    target_kind: str
    source: str
    workspace_bytes: dict[str, int]

    @property
    def suffix(self) -> str:
        """The file name suffix the source must be compiled under (.cc for g++, .cu for nvcc)."""
        return SOURCE_SUFFIXES[self.target_kind]


def generate(functions: dict[str, Function], target_kind: str) -> GeneratedSource:
    """One C++ (cpu) or CUDA (cuda) source defining every function under its symbol."""
    if target_kind not in TARGET_KINDS:
        raise BuildError(f"builtin codegen: target kind {target_kind!r} is not one of {', '.join(TARGET_KINDS)}")
    rendered, workspace = [], {}
    for symbol, func in functions.items():
        problem = symbol_name_problem(symbol)
        if problem:
            raise BuildError(f"builtin codegen: symbol {symbol!r} cannot be a C symbol: {problem}")
        if func.is_extern:
            raise BuildError(f"builtin codegen: {symbol} has no body to generate code from")
        if is_elementwise_function(func):
            rendered.append({"kind": "elementwise", **elementwise_kernel(symbol, func, target_kind)})
            workspace[symbol] = 0
        elif func.attrs.get("Composite") == CONV_EPILOGUE_COMPOSITE and target_kind == "cuda":
            rendered.append({"kind": "conv2d_epilogue", **conv_epilogue_cuda(symbol, func)})
            workspace[symbol] = 0
        elif func.attrs.get("Composite") == CONV_EPILOGUE_COMPOSITE:
            conv_calls, loop, wrapper = conv_epilogue_cpu(symbol, func)
            rendered += [{"kind": "shim_calls", **conv_calls}, {"kind": "elementwise", **loop},
                         {"kind": "conv_then_elementwise", **wrapper}]
            workspace[symbol] = wrapper["workspace_bytes"]
        else:
            if func.attrs.get("Composite") == LAYOUT_COMPOSITE:
                calls = emit_layout_chain(symbol, func, target_kind)
            elif func.attrs.get("Composite") == SE_COMPOSITE:
                calls = emit_squeeze_excitation(symbol, func, target_kind)
            elif func.attrs.get("Composite") == CONCAT_VIEWS_COMPOSITE:
                calls = emit_concat_views(symbol, func, target_kind)
            else:
                calls = emit_shim_calls(symbol, func, target_kind)
            rendered.append({"kind": "shim_calls", **calls.as_dict()})
            workspace[symbol] = calls.workspace_bytes
    source = render_template("builtin/source.j2", {
        "target_kind": target_kind,
        "cuda": target_kind == "cuda",
        "functions": rendered,
    })
    return GeneratedSource(target_kind, source, workspace)
