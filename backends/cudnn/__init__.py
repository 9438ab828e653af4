"""The cudnn backend (a library backend of the CSource flavor): NHWC convolutions of any
window and grouping with their bias, residual and activation epilogue, each one cuDNN
operation graph. Generated entry points (templates/cudnn/entries.cc.j2) describe each conv
as plain data; the engine (engine/cudnn_conv.cc, cuDNN's backend API) builds its graph and
execution plan when a model instance is created and only executes at run. Where the build
can measure, the plan is the one plans.py timed fastest on this GPU model, kept in the cost
store; elsewhere the heuristic's. Needs cuDNN 9 (pip install nvidia-cudnn-cu13) to build
and to run; configs that do not list cudnn do not."""
from __future__ import annotations

from byoc.backend import register_backend
from byoc.target import AttrSchema, at_least, register_target_kind

from .codegen import codegen, known_cost, learn_costs
from .patterns import pattern_table

register_target_kind("cudnn", {
    "workspace_limit": AttrSchema(int, 32 << 20, None, "cuDNN workspace a conv's plan may use (bytes; the convs "
                                  "share the model's workspace, one at a time)",
                                  check=at_least(0)),
    "tf32": AttrSchema(bool, False, None, "float32 convs may run on cuDNN's engines on TF32 tensor cores (the "
                       "config's tf32 key sets it); off, cudnn leaves float32 convs to the other backends (cuDNN 9 has "
                       "no exact engine for many fused ones)"),
    "share_functions": AttrSchema(bool, True, None, "convs of one shape share one function, and so one plan and "
                                  "cuDNN handle per model; false: each call its own (more plans and "
                                  "handles to build at create)"),
    "plan": AttrSchema(str, "auto", ("auto", "heuristic"), "each conv's execution plan: auto: the fastest of "
                       "cuDNN's engines, timed at build time where a GPU of the target's arch is visible (kept in "
                       "the cost store), else the heuristic's; heuristic: the heuristic's first plan that builds, "
                       "chosen at create"),
})


def prepare_for_partition(mod, target, build_device: str):
    """The cudnn backend runs NHWC convs: conv chains go NHWC once (ConvertConvLayout), in a
    cuda build; float32 ones only with the target's tf32 on. Without TF32 tensor cores,
    cuDNN 9 has no engine for many fused float32 convs (ResNet-50's on an H200: the build
    failed naming one), so with tf32 off float32 convs stay NCHW, for the other backends."""
    if build_device != "cuda":
        return mod
    from byoc.transform.convert_conv_layout import convert_conv_layout
    dtypes = ("float32", "float16", "bfloat16") if target.attrs["tf32"] else ("float16", "bfloat16")
    return convert_conv_layout(mod, dtypes=dtypes)


def unavailable() -> str | None:
    """What this machine lacks to build cudnn functions (cuDNN 9's headers and library)."""
    from byoc.toolchain.locate import missing_nvidia_library
    return missing_nvidia_library("cudnn")


register_backend("cudnn", flavor="csource", patterns=pattern_table(), codegen=codegen, device="cuda",
                 one_composite_per_function=True, pre_partition=prepare_for_partition, known_cost=known_cost,
                 learn_costs=learn_costs, unavailable=unavailable)
