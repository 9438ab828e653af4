"""byoc: bring-your-own-codegen build framework. Pipeline folders in order:
frontend/ -> ir/ -> transform/ -> backends/ -> codegen/ -> toolchain/ -> runtime/."""
import os as _os

# In a source checkout the pipeline folders backends/, templates/ and build_configs/ sit
# next to this package; installed, setup.py puts them inside it. Let the checkout's
# folders import as byoc.backends etc. too (for tests run from the repository root).
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isdir(_os.path.join(_checkout, "backends")) and \
        not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "backends")):
    __path__.append(_checkout)

from .errors import (ByocError, ModelError, UnsupportedOpError, TypeInferenceError, ParseError,
                     ConfigError, BuildError, CompileError, RuntimeError, DeviceConflictError, ByocWarning)
from .interpreter import interpret
from .frontend import from_onnx
from .build import build, Library
from . import runtime
from .runtime import load
from .refit import refit, RefitError
