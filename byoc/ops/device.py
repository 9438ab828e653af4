"""Device annotations: on_device and device_copy (byoc.transform.plan_devices reads them).

Both are the identity on values: type inference returns the input's type and the NumPy
reference returns the input, so the interpreter and constant folding run annotated
programs unchanged. Device attributes are VirtualDevice text (`cpu`, `cuda:1`,
`cpu/host-pinned`, see byoc.ir.virtual_device), checked when the call is made.

    on_device(%x, device="cpu")                          body %x on cpu; result free
    on_device(%x, device="cpu", constrain_result=true)   body and result fixed to cpu
    on_device(%x, device="cpu", constrain_body=false)    a copy may go here; both free
    on_device(%x, device="cpu", constrain_body=false, constrain_result=true)
                                                         result on cpu; body free
    device_copy(%x, src="cuda", dst="cpu")               an explicit copy
"""
from __future__ import annotations

from ..errors import TypeInferenceError
from ..ir.op import AttrSpec, register_op
from ..ir.virtual_device import VirtualDevice


def _check_device(op_name: str, attr_name: str, text: str):
    try:
        VirtualDevice.parse(text)
    except ValueError as error:
        raise TypeInferenceError(f"{op_name}: attribute {attr_name}: {error}") from None


def _infer_on_device(arg_types, attrs):
    _check_device("on_device", "device", attrs["device"])
    return arg_types[0]


def _infer_device_copy(arg_types, attrs):
    _check_device("device_copy", "src", attrs["src"])
    _check_device("device_copy", "dst", attrs["dst"])
    return arg_types[0]


def _identity(x, **attrs):
    return x


register_op(
    "on_device", num_inputs=1, infer=_infer_on_device, reference=_identity,
    attrs={"device": AttrSpec("str"), "constrain_body": AttrSpec("bool", True),
           "constrain_result": AttrSpec("bool", False)},
    category="annotation",
    doc="Device annotation for PlanDevices: the identity on its input; removed by planning.")

register_op(
    "device_copy", num_inputs=1, infer=_infer_device_copy, reference=_identity,
    # where PlanMemory put the copy's result (byoc.transform.plan_memory): none until it runs
    attrs={"src": AttrSpec("str"), "dst": AttrSpec("str"), "storage": AttrSpec("str", ""),
           "offset": AttrSpec("optional_int", None), "size": AttrSpec("optional_int", None),
           "output": AttrSpec("optional_int", None)},
    category="annotation",
    doc="Copy a tensor from virtual device src to virtual device dst (the identity on values).")

DEVICE_OPS = ("on_device", "device_copy")
