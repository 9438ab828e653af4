"""refit(): new weights for a built library, without compiling it again (TensorRT refits an
engine; AOTInductor loads new constants).

    result = byoc.refit("model.so", "finetuned.onnx", output="finetuned.safetensors")
    module = byoc.load("model.so", weights_path=result.path)     # or module.load_weights(...)

A library records how it was built (metadata "build": the config and the model's
initializers by name, dtype, shape and checksum) and its program id: a hash of everything
it compiled and of how the weights are laid out, but not of their bytes (package.py:
program_identity). refit() checks the new initializers against the record (every name
there, no other, each of its dtype and shape), builds the program again from them with the
recorded config, stopping before anything is compiled, and writes the weights blob it made
as a weights file (.safetensors) carrying the program id and the blob's checksum. The
library's runtime takes that file at create when the ids match, whether it embeds its
weights or keeps them in a sidecar.

The new weights come as a whole ONNX model (the same graph exported from a fine-tuned
checkpoint), or as tensors by name (`weights=`: a mapping, an .npz or a .safetensors file)
put into the model given (then the original one). Where new values change what the build
compiles, not only the blob (a weight of one element is part of a kernel's code; a pass
simplified a constant by its values), the program ids differ and refit() refuses, naming
the initializers that changed: that model needs a rebuild.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import BuildError, ModelError

# safetensors' dtype names -> byoc's (the ones NumPy reads directly, and bfloat16)
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
MAX_SAFETENSORS_HEADER = 100 << 20


class RefitError(BuildError):
    """New weights that do not fit the library (the message names the tensor and what was expected)."""


@dataclass
class RefitResult:
    """The weights file written, the program id it carries, and the initializers whose
    values differ from the build's (by checksum), in the model's order."""
    path: Path
    program_id: str
    changed: list
    initializers: int


def refit(library, model, *, output, weights=None, config=None, progress=None) -> RefitResult:
    """Write a weights file for `library` (a .so path or a built Library) from new weights.

    `model`: the ONNX model (path, bytes or ModelProto) with the new weights, or, with
    `weights` (a mapping name -> array, or an .npz or .safetensors path), the model whose
    initializers those replace by name. `output`: where the weights file goes (never the
    library itself). `config`: the build config to use instead of the recorded one (e.g.
    with the tuning_db the build used, which the record leaves out). Raises RefitError."""
    from .build import make_workdir
    from .codegen.host import blob_checksum, write_safetensors
    from .config import for_device, load_config
    from .package import library_parts
    from .pipeline import BuildContext
    from .progress import BuildProgress
    from .runtime import metadata_of
    from .shape_buckets import lower_programs
    from .target import resolve_device_target
    library_path = Path(getattr(library, "path", library))
    metadata = metadata_of(library_path)
    record, program_id = metadata.get("build"), metadata.get("program_id")
    if not record or not program_id:
        raise RefitError(f"{library_path.name} has no build record (built before byoc could refit, or from an "
                         f"IRModule): rebuild it to refit it later")
    _check_record(record, library_path)
    if not record.get("initializers"):
        raise RefitError(f"{library_path.name} was built from a model without initializers by name (an IRModule); "
                         f"refit takes ONNX initializers: rebuild it instead")
    output = _checked_output(output, library_path)
    proto = _model_with(model, weights, record["initializers"]) if weights is not None else model
    _check_initializers(_declared_initializers(proto), record["initializers"])
    recorded = dict(record["config"])
    recorded["tuning"] = {**recorded.get("tuning", {}), "profile": False}  # the kernels the database names
    cfg = load_config(config if config is not None else recorded)
    progress = progress or BuildProgress()
    workdir, temporary = make_workdir(cfg.workdir)
    try:
        device = resolve_device_target(cfg.target)
        cfg, _ = for_device(cfg, device)  # a config of `backends: auto` given anew
        context = BuildContext(config=cfg, target=device, workdir=workdir, model=proto, progress=progress)
        progress.stage(f"refit: building the program of {library_path.name} from the new weights")
        with progress.heartbeat():
            programs, padding = lower_programs(context)
            parts = library_parts(programs, context, padding)
    finally:
        if temporary:
            import shutil
            shutil.rmtree(workdir, ignore_errors=True)
    built = programs[0].mod.attrs.get("initializers")
    built = built.complete() if built is not None else []
    before = {entry["name"]: entry["checksum"] for entry in record["initializers"]}
    changed = [entry["name"] for entry in built if before.get(entry["name"]) != entry["checksum"]]
    if parts.program_id != program_id:
        shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
        raise RefitError(f"the new weights change the program of {library_path.name}, not only its weights (program "
                         f"id {parts.program_id}, the library's {program_id}): a weight is compiled into its code "
                         f"(one of a single element) or a pass simplified it by its values, or the config or byoc "
                         f"differ from the build's; initializers changed: {shown or 'none'}. Rebuild the model "
                         f"(or pass config= the build used)")
    temporary_output = output.with_name(f".{output.name}.partial")
    try:
        write_safetensors(temporary_output, parts.weights, metadata.get("build_id", ""), program_id,
                          blob_checksum(parts.weights))
        os.replace(temporary_output, output)
    except OSError as error:
        temporary_output.unlink(missing_ok=True)
        raise RefitError(f"cannot write the weights file {output}: {error.strerror or error}") from None
    progress.stage(f"refit: {len(changed)} of {len(built)} initializers changed; weights in {output}")
    return RefitResult(output, program_id, changed, len(built))


def _check_record(record, library_path: Path):
    """The library's build record has the form build_record writes (metadata.py)."""
    def entry_ok(entry):
        return (isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("dtype"), str)
                and isinstance(entry.get("shape"), list) and all(isinstance(d, int) for d in entry["shape"])
                and isinstance(entry.get("checksum"), str))
    initializers = record.get("initializers") if isinstance(record, dict) else None
    if not (isinstance(record, dict) and isinstance(record.get("config"), dict)
            and (initializers is None or (isinstance(initializers, list) and all(map(entry_ok, initializers))))):
        raise RefitError(f"{library_path.name}: its metadata's build record is malformed (expected a config and "
                         f"initializers with name, dtype, shape and checksum): the library was changed after its "
                         f"build; rebuild it")


def _checked_output(output, library_path: Path) -> Path:
    if output is None or not isinstance(output, (str, os.PathLike)) or "\0" in os.fsdecode(output):
        raise RefitError(f"output={output!r}: expected the path of the weights file to write (e.g. "
                         f"'{library_path.stem}.refit.safetensors')")
    path = Path(output).resolve()
    if path == library_path.resolve():
        raise RefitError(f"output {path} is the library itself; expected a separate .safetensors file")
    if path.is_dir():
        raise RefitError(f"output {path} is a directory; expected a file path")
    if not path.parent.is_dir():
        raise RefitError(f"output {path}: its directory {path.parent} does not exist")
    return path


def _load_proto(model):
    """The ModelProto of `model` (path, bytes or proto) with its external data read."""
    import onnx
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        return onnx.load(os.fspath(model))
    except (OSError, ValueError, TypeError) as error:
        raise ModelError(f"cannot read the ONNX model {str(model)[:200]!r}: {error}") from None
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and the like
        raise ModelError(f"cannot read the ONNX model {str(model)[:200]!r}: not a valid ONNX file ({error})") from None


def _declared_initializers(model) -> dict:
    """name -> (dtype, shape) of the model's initializers, read without their data where
    the model is a path (its external data is not loaded)."""
    import onnx
    from .frontend.onnx_model import dtype_of_elem_type
    if isinstance(model, (str, os.PathLike)):
        try:
            proto = onnx.load(os.fspath(model), load_external_data=False)
        except Exception as error:  # noqa: BLE001 - a missing file, protobuf's DecodeError
            raise ModelError(f"cannot read the ONNX model {str(model)!r}: {error}") from None
    else:
        proto = _load_proto(model)
    declared = {}
    for tensor in proto.graph.initializer:
        declared[tensor.name] = (dtype_of_elem_type(tensor.data_type, f"initializer {tensor.name!r}"), list(tensor.dims))
    return declared


def _check_initializers(declared: dict, recorded: list):
    """Every recorded initializer present with its dtype and shape, and no other."""
    names = [entry["name"] for entry in recorded]
    known = set(names)
    missing = [name for name in names if name not in declared]
    if missing:
        raise RefitError(f"initializer {missing[0]!r} of the built model is not in the new model"
                         f"{f' ({len(missing)} missing)' if len(missing) > 1 else ''}; expected the same initializers "
                         f"by name (the model the library was built from, with new values)")
    extra = [name for name in declared if name not in known]
    if extra:
        raise RefitError(f"initializer {extra[0]!r} of the new model is not one of the built model's"
                         f"{f' ({len(extra)} such)' if len(extra) > 1 else ''}; expected the same initializers by name")
    for entry in recorded:
        dtype, shape = declared[entry["name"]]
        if dtype != entry["dtype"] or shape != list(entry["shape"]):
            raise RefitError(f"initializer {entry['name']!r} is {dtype} {shape} in the new model; the library was "
                             f"built for {entry['dtype']} {list(entry['shape'])}")


def _model_with(model, weights, recorded: list):
    """The model's proto with the initializers `weights` names replaced by its arrays
    (each checked against the build record's dtype and shape first)."""
    from onnx import numpy_helper
    from .ir.types import dtype_of_numpy
    arrays = _read_weights(weights)
    proto = _load_proto(model)
    proto_copy = type(proto)()
    proto_copy.CopyFrom(proto)
    by_name = {tensor.name: tensor for tensor in proto_copy.graph.initializer}
    built = {entry["name"]: entry for entry in recorded}
    for name, array in arrays.items():
        if name not in built or name not in by_name:
            known = ", ".join(list(built)[:6])
            raise RefitError(f"weights name {name!r}, which is not an initializer of the model; its initializers "
                             f"are {known}{', ...' if len(built) > 6 else ''}")
        try:
            dtype = dtype_of_numpy(array.dtype)
        except TypeError:
            dtype = str(array.dtype)
        entry = built[name]
        if dtype != entry["dtype"] or list(array.shape) != list(entry["shape"]):
            raise RefitError(f"weights {name!r} is {dtype} {list(array.shape)}; the library was built for "
                             f"{entry['dtype']} {list(entry['shape'])}")
        by_name[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), name))
    return proto_copy


def _read_weights(weights) -> dict:
    """name -> array from a mapping, an .npz or a .safetensors file."""
    if isinstance(weights, dict):
        arrays = {}
        for name, value in weights.items():
            if not isinstance(name, str):
                raise RefitError(f"weights: expected tensor names (str) as keys, got {type(name).__name__}")
            arrays[name] = _host_array(name, value)
        return arrays
    if not isinstance(weights, (str, os.PathLike)):
        raise RefitError(f"weights: expected a mapping of name to array, or a path to an .npz or .safetensors file; "
                         f"got {type(weights).__name__}")
    path = Path(weights)
    if not path.is_file():
        raise RefitError(f"weights file {path} does not exist or is not a regular file")
    if path.suffix == ".npz":
        import zipfile
        try:
            data = np.load(path, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("it holds one array, not named ones (an .npy)")
            with data:
                return {name: data[name] for name in data.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
            raise RefitError(f"weights file {path} is not a readable .npz of named arrays: {error}") from None
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    raise RefitError(f"weights file {path}: expected an .npz or .safetensors file")


def _host_array(name: str, value) -> np.ndarray:
    """A weight given by name as a NumPy array: NumPy's, torch's (bfloat16 through float32,
    exactly), CuPy's (copied to the host), or anything np.asarray takes."""
    try:
        if hasattr(value, "detach"):  # a torch tensor (a state dict's)
            import torch
            tensor = value.detach().cpu()
            if tensor.dtype == torch.bfloat16:
                import ml_dtypes
                return tensor.float().numpy().astype(ml_dtypes.bfloat16)
            return tensor.numpy()
        if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):  # a CuPy array
            return value.get()
        array = np.asarray(value)
    except Exception as error:  # noqa: BLE001 - whatever the caller's object raised, named
        raise RefitError(f"weights {name!r}: cannot be read as an array ({type(error).__name__}: {error})") from None
    if array.dtype == object:
        raise RefitError(f"weights {name!r}: expected an array of numbers, got {type(value).__name__}")
    return array


def read_safetensors(path) -> dict:
    """name -> array of a .safetensors file (its tensors in the dtypes NumPy and ml_dtypes
    read), each checked to lie inside the file's data."""
    from .ir.types import numpy_dtype
    path = Path(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(8)
        header_bytes = int.from_bytes(head, "little") if len(head) == 8 else -1
        if header_bytes < 2 or header_bytes > min(MAX_SAFETENSORS_HEADER, size - 8):
            raise RefitError(f"weights file {path} is not a .safetensors file (its header length is wrong)")
        try:
            header = json.loads(file.read(header_bytes))
        except (ValueError, UnicodeDecodeError, RecursionError) as error:
            raise RefitError(f"weights file {path}: its .safetensors header is not JSON ({error})") from None
        if not isinstance(header, dict):
            raise RefitError(f"weights file {path}: its .safetensors header is not a JSON object")
        data = np.fromfile(file, dtype=np.uint8)
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"weights file {path}: tensor {name!r}"
        if not isinstance(entry, dict) or entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise RefitError(f"{where} has dtype {entry.get('dtype') if isinstance(entry, dict) else entry!r}; "
                             f"expected one of {', '.join(SAFETENSORS_DTYPES)}")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= len(data)):
            raise RefitError(f"{where} has shape {shape!r} and data_offsets {offsets!r}; expected dims >= 0 and "
                             f"offsets within the file's {len(data)} bytes of data")
        dtype = numpy_dtype(SAFETENSORS_DTYPES[entry["dtype"]])
        count = math.prod(shape)  # Python ints: no overflow to wrap a huge shape to a small size
        if count * dtype.itemsize != offsets[1] - offsets[0]:
            raise RefitError(f"{where}: shape {shape} of {entry['dtype']} needs {count * dtype.itemsize} bytes; "
                             f"its data_offsets span {offsets[1] - offsets[0]}")
        arrays[name] = data[offsets[0]:offsets[1]].view(dtype).reshape(shape)
    return arrays
