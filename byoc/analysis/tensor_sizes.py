"""CheckTensorSizes: every tensor of main within what one machine can hold, checked before
any backend writes a size into C++ (the pipeline's check_sizes stage)."""
from __future__ import annotations

from ..errors import BuildError
from ..ir.types import TensorType

# The most bytes one tensor, or an arena, may take: 4 TiB, more than any one GPU or host
# holds, so that a model whose shapes no machine runs (an output of 16 TiB) is refused when
# it is built, not by the allocator of its first run; far below where 64-bit sizes and
# offsets in the generated code and the shims, or sums of a few of them, could wrap.
MAX_BYTES = 1 << 42


def check_tensor_sizes(main) -> None:
    """A BuildError naming the first tensor of `main` (parameter or binding) larger than
    MAX_BYTES: a model whose shapes no machine holds, caught before any size is written
    into C++."""
    def tensors(type_):
        if isinstance(type_, TensorType):
            yield type_
        else:
            for field_type in getattr(type_, "fields", ()):
                yield from tensors(field_type)
    values = [(param.name_hint, param.type) for param in main.params]
    values += [(binding.var.name_hint, binding.var.type) for binding in main.bindings]
    for name, type_ in values:
        for tensor in tensors(type_):
            size = tensor.nbytes
            if size > MAX_BYTES:
                raise BuildError(f"tensor {name!r} of shape {tuple(tensor.shape)} ({tensor.dtype}) needs {size} bytes "
                                 f"({size / 2**40:.0f} TiB), more than the {MAX_BYTES} (4 TiB) one tensor may take")
