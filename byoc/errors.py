"""Error types a user can catch; every message names the thing and what was expected."""
import builtins


class ByocError(Exception):
    """Base class of every error byoc raises on purpose."""


class ModelError(ByocError):
    """The model file is not a readable, well-formed model."""


class UnsupportedOpError(ByocError):
    """The model uses operators (or operator variants) that byoc does not support."""


class TypeInferenceError(ByocError):
    """An operator was called with arguments whose types it cannot accept."""


class ParseError(ByocError):
    """IR text could not be parsed."""


class ConfigError(ByocError):
    """A build configuration is invalid."""


class BuildError(ByocError):
    """Building a model failed (codegen, compiler or linker)."""


class CompileError(BuildError):
    """The compiler or the linker failed on generated sources; the message says where they
    are and how to rerun the command (the work directory is kept for that)."""


class ByocWarning(UserWarning):
    """A build goes on, but the user should know (an unusable object cache, a workdir that
    cannot be locked, tuning candidates that did not compile); the CLI prints these as
    'byoc: warning: ...'."""


class RuntimeError(ByocError, builtins.RuntimeError):  # noqa: A001 - deliberately byoc.RuntimeError
    """Running a built model failed. Also a builtin RuntimeError, so that code catching
    that (as it would around onnxruntime or torch) catches byoc's too."""


class DeviceConflictError(BuildError):
    """PlanDevices found two fixed device constraints that cannot both hold (the message
    names both, and where each came from)."""
