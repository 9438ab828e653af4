"""Virtual devices: where a tensor lives and where the code that touches it runs.

A VirtualDevice is a device type ("cpu" or "cuda"), a device id and a memory scope:

    "global"       the device's ordinary memory: GPU memory (cudaMalloc) on cuda,
                   pageable host memory (malloc) on cpu
    "host-pinned"  page-locked host memory (cudaMallocHost): cpu only; copies between it
                   and a GPU run asynchronously on the stream

so the memories the model runtime distinguishes are `cuda` (its device arena), `cpu`
(pageable host) and `cpu/host-pinned`. Device ids are part of the device: `cuda:1` is
another device than `cuda` (PlanDevices copies between them); a build whose runtime
drives one GPU refuses values placed on another, by name.

They are written as text in on_device/device_copy attributes and in configs:
`cpu`, `cuda`, `cuda:1`, `cpu/host-pinned` (id 0 and scope "global" are left out; the
long form `cuda:0/global` is read too).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DEVICE_TYPES = ("cpu", "cuda")
MEMORY_SCOPES = ("global", "host-pinned")

_TEXT = re.compile(r"(?P<type>[a-z]+)(?::(?P<id>[0-9]+))?(?:/(?P<scope>[a-z-]+))?\Z")


@dataclass(frozen=True)
class VirtualDevice:
    device_type: str
    device_id: int = 0
    memory_scope: str = "global"

    def __post_init__(self):
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"device type {self.device_type!r} is not one of {', '.join(DEVICE_TYPES)}")
        if isinstance(self.device_id, bool) or not isinstance(self.device_id, int) or self.device_id < 0:
            raise ValueError(f"device id {self.device_id!r} is not a non-negative integer")
        if self.memory_scope not in MEMORY_SCOPES:
            raise ValueError(f"memory scope {self.memory_scope!r} is not one of {', '.join(MEMORY_SCOPES)}")
        if self.memory_scope == "host-pinned" and self.device_type != "cpu":
            raise ValueError(f"memory scope 'host-pinned' is host memory: it needs device type cpu, "
                             f"not {self.device_type!r}")

    @staticmethod
    def parse(text) -> "VirtualDevice":
        """A VirtualDevice from its text (`cuda`, `cuda:1`, `cpu/host-pinned`), or itself."""
        if isinstance(text, VirtualDevice):
            return text
        match = _TEXT.match(str(text))
        if match is None:
            raise ValueError(f"{text!r} is not a virtual device; expected <type>[:<id>][/<scope>] "
                             f"with type one of {', '.join(DEVICE_TYPES)} and scope one of "
                             f"{', '.join(MEMORY_SCOPES)}, e.g. 'cuda', 'cuda:1', 'cpu/host-pinned'")
        return VirtualDevice(match["type"], int(match["id"] or 0), match["scope"] or "global")

    @property
    def is_host(self) -> bool:
        return self.device_type == "cpu"

    def __str__(self) -> str:
        text = self.device_type
        if self.device_id:
            text += f":{self.device_id}"
        if self.memory_scope != "global":
            text += f"/{self.memory_scope}"
        return text


CPU = VirtualDevice("cpu")
CUDA = VirtualDevice("cuda")
HOST_PINNED = VirtualDevice("cpu", 0, "host-pinned")
