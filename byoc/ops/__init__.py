"""The ops byoc knows: each module registers its ops (schema, type inference, NumPy reference)."""
from . import elementwise, reduction, normalization, linalg, nn, layout, device  # noqa: F401
