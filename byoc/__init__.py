"""byoc: bring-your-own-codegen build framework. Pipeline folders in order:
frontend/ -> ir/ -> transform/ -> backends/ -> codegen/ -> toolchain/ -> runtime/."""
from .errors import (ByocError, ModelError, UnsupportedOpError, TypeInferenceError, ParseError,
                     ConfigError, BuildError, RuntimeError)
from .interpreter import interpret
from .frontend import from_onnx
