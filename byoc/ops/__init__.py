"""The ops byoc knows: each module registers its ops (schema, type inference, NumPy reference)."""
from . import elementwise, reduction, normalization, linalg, nn, layout  # noqa: F401
