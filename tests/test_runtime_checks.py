"""The runtime's checks of what a caller hands it: library files (not regular, truncated,
corrupted metadata), out= arrays that overlap inputs, streams, malformed array objects.
Cases that could crash or hang run in a subprocess with a timeout."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.runtime import validate_metadata


@pytest.fixture(scope="module")
def add_library(tmp_path_factory):
    """y = x + x + 1 on the cpu: small, one input, one output."""
    tmp = tmp_path_factory.mktemp("runtime_checks")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    one = helper.make_tensor("one", TensorProto.FLOAT, [8], np.arange(8, dtype=np.float32))
    nodes = [helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [one]),
                              opset_imports=[helper.make_opsetid("", 17)])
    library = byoc.build(model, config="cpu", workdir=str(tmp / "w"))
    return Path(library.path)


def run_isolated(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter: a crash or a hang shows as a failed test."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_truncated_library_is_refused_before_the_loader_maps_it(add_library, tmp_path, fraction):
    data = add_library.read_bytes()
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(data[:int(len(data) * fraction)])
    result = run_isolated(f"""
        import byoc
        try:
            byoc.load({str(truncated)!r})
        except byoc.RuntimeError as error:
            print("REFUSED", error)
        """)
    assert result.returncode == 0, result.stderr
    assert "REFUSED" in result.stdout and "truncated or corrupted" in result.stdout


def test_fifo_directory_and_symlink_loop_are_refused(tmp_path):
    fifo = tmp_path / "model.so"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.so"
    loop.symlink_to(tmp_path / "loop.so")
    result = run_isolated(f"""
        import byoc
        for path in ({str(fifo)!r}, {str(tmp_path)!r}, {str(loop)!r}):
            try:
                byoc.load(path)
            except byoc.RuntimeError as error:
                print("REFUSED", error)
        """, timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("REFUSED") for line in lines), result.stdout
    assert "not a regular file" in lines[0] and "directory" in lines[1]


def test_a_changed_byte_anywhere_is_refused_by_the_seal(add_library, tmp_path):
    """The seal (SHA-256 of the file, appended at the build) is checked before the dynamic
    loader maps the file: a damaged dynamic section would crash the loader itself."""
    data = add_library.read_bytes()
    for offset in (100, len(data) // 3, len(data) - byoc.runtime.SEAL_BYTES - 1, len(data) - 1):
        edited = bytearray(data)
        edited[offset] ^= 0x40
        path = tmp_path / "edited.so"
        path.write_bytes(bytes(edited))
        result = run_isolated(f"""
            import byoc
            try:
                byoc.load({str(path)!r})
            except byoc.RuntimeError as error:
                print("REFUSED", error)
            """)
        assert result.returncode == 0 and "REFUSED" in result.stdout, (offset, result)


def test_non_elf_file_is_refused(tmp_path):
    fake = tmp_path / "model.so"
    fake.write_bytes(b"not an elf file" * 10)
    with pytest.raises(byoc.RuntimeError, match="not an ELF shared object"):
        byoc.load(fake)


@pytest.mark.parametrize("edit, key", [
    (lambda m: m.pop("weights"), "weights"),
    (lambda m: m.update(format="other"), "format"),
    (lambda m: m["inputs"][0].update(shape=[4, -8]), "inputs[0].shape"),
    (lambda m: m["inputs"][0].update(dtype="complex64"), "inputs[0].dtype"),
    (lambda m: m["outputs"].append(7), "outputs[1]"),
    (lambda m: m["weights"].update(location="cloud"), "weights.location"),
    (lambda m: m.update(version=True), "version"),
    # a library of shape buckets: each program's tensors
    (lambda m: m.update(variants={"inputs": []}), "variants"),
    (lambda m: m.update(variants=[{"inputs": m["inputs"]}]), "variants[0].outputs"),
    (lambda m: m.update(variants=[{"inputs": [], "outputs": m["outputs"]}]), "variants[0].inputs"),
    (lambda m: m.update(variants=[{"inputs": [{"name": "x", "shape": ["b"], "dtype": "float32"}],
                                   "outputs": m["outputs"]}]), "variants[0].inputs[0].shape"),
    (lambda m: m.update(variants=[{"dims": {"batch": 0}, "inputs": m["inputs"], "outputs": m["outputs"]}]),
     "variants[0].dims"),
    (lambda m: m.update(variants=[{"dims": {"batch": 3}, "outputs": m["outputs"],
                                   "inputs": [{**m["inputs"][0], "axis_dims": ["batch", None]}]}]),
     "variants[0].inputs[0].axis_dims"),
    (lambda m: m.update(variants=[{"dims": {"batch": 4}, "inputs": m["inputs"],
                                   "outputs": [{**m["outputs"][0], "axis_dims": ["sequence", None]}]}]),
     "variants[0].outputs[0].axis_dims"),
])
def test_metadata_is_validated_with_the_key_named(add_library, edit, key):
    metadata = byoc.runtime.metadata_of(add_library)
    validate_metadata(metadata)  # as built: valid
    edited = json.loads(json.dumps(metadata))
    edit(edited)
    with pytest.raises(byoc.RuntimeError, match=key.replace("[", r"\[").replace("]", r"\]")):
        validate_metadata(edited)


def test_metadata_bytes_edited_in_the_file_are_refused(add_library, tmp_path):
    data = add_library.read_bytes()
    start = data.index(b'{"arch"')
    for replacement, message in ((b'{"arch"'.replace(b"{", b"["), "not valid UTF-8 JSON"),
                                 (b'{"arch"'.replace(b"a", b"\xff", 1), "not valid UTF-8 JSON")):
        edited = data[:start] + replacement + data[start + len(replacement):]
        path = tmp_path / "edited.so"
        path.write_bytes(edited[:-byoc.runtime.SEAL_BYTES])
        byoc.runtime.seal_library(path)  # sealed again: what the metadata check sees, not the seal
        result = run_isolated(f"""
            import byoc
            try:
                byoc.load({str(path)!r})
            except byoc.RuntimeError as error:
                print("REFUSED", error)
            """)
        assert result.returncode == 0 and "REFUSED" in result.stdout and message in result.stdout, result


def test_out_overlapping_an_input_is_refused(add_library):
    module = byoc.load(add_library)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    expected = x + x + np.arange(8, dtype=np.float32)
    with pytest.raises(byoc.RuntimeError, match="output 'y' .* overlaps input 'x'"):
        module.run(x, out=x)
    buffer = np.zeros(64, dtype=np.float32)
    with pytest.raises(byoc.RuntimeError, match="overlaps input"):  # a view sharing part of the input
        module.run(buffer[:32].reshape(4, 8), out=buffer[16:48].reshape(4, 8))
    np.testing.assert_array_equal(module.run(x), expected)  # still usable


def test_a_tensor_between_element_boundaries_is_refused_by_name(add_library):
    """A float32 view that starts one byte into a buffer: reading it as floats is undefined
    behaviour, so run() names the tensor instead."""
    module = byoc.load(add_library)
    raw = np.zeros(32 * 4 + 1, dtype=np.uint8)
    misaligned = raw[1:].view(np.float32).reshape(4, 8)
    assert not misaligned.flags.aligned
    with pytest.raises(byoc.RuntimeError, match=r"input 'x' \(#0\).*not a multiple of its element size \(4 bytes\)"):
        module.run(misaligned)
    out_raw = np.zeros(32 * 4 + 2, dtype=np.uint8)
    with pytest.raises(byoc.RuntimeError, match=r"output 'y' \(#0\).*element size"):
        module.run(np.ones((4, 8), np.float32), out=out_raw[2:].view(np.float32).reshape(4, 8))
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(module.run(x), x + x + np.arange(8, dtype=np.float32))  # still usable


def test_stream_on_the_cpu_target_is_refused(add_library):
    module = byoc.load(add_library)
    with pytest.raises(byoc.RuntimeError, match="runs on the cpu"):
        module.run(np.zeros((4, 8), np.float32), stream=12345)


def test_stream_handles_are_checked():
    from byoc.runtime import _stream_handle

    class CupyLike:
        ptr = 0x1234

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x5678)
    assert _stream_handle(CupyLike()) == 0x1234 and _stream_handle(Protocol()) == 0x5678 and _stream_handle(0) == 0
    for bad in (12345, -1, "stream", 1.5):
        with pytest.raises(byoc.RuntimeError, match="stream="):
            _stream_handle(bad)


class _BrokenInterface:
    def __init__(self, interface):
        self.__array_interface__ = interface


@pytest.mark.parametrize("interface", [
    {},
    {"shape": (4, 8)},
    {"shape": "abc", "typestr": "<f4", "data": (0, False)},
    {"shape": (4, 8), "typestr": 5, "data": (0, False)},
    {"shape": (4, 8), "typestr": "<f4", "data": ("x", False)},
    {"shape": (4, 8), "typestr": "<f4", "data": (1, False), "strides": (4,)},
    {"shape": (4, -8), "typestr": "<f4", "data": (1, False)},
])
def test_malformed_array_interfaces_are_refused(add_library, interface):
    module = byoc.load(add_library)
    with pytest.raises(byoc.RuntimeError, match="input 'x'"):
        module.run(_BrokenInterface(interface))


def test_closed_modules_leave_no_mapping_or_memory_behind(add_library, tmp_path):
    """Each load maps a library; close() unmaps it again (the model's thread-local error
    buffer has no destructor, which would have pinned it), so a long-lived process that
    loads and closes many models does not grow."""
    result = run_isolated(f"""
        import os, shutil, numpy as np, byoc
        def mappings():
            return sum(1 for _ in open("/proc/self/maps"))
        def rss_kb():
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
        x = np.ones((4, 8), np.float32)
        counts = []
        for i in range(60):
            copy = {str(tmp_path)!r} + f"/model_{{i}}.so"  # a new file each time: a new mapping
            shutil.copy({str(add_library)!r}, copy)
            module = byoc.load(copy)
            module.run(x)
            byoc.runtime.metadata_of(copy)
            module.close()
            os.unlink(copy)
            if i in (9, 59):
                counts.append((mappings(), rss_kb(), len(os.listdir("/proc/self/fd"))))
        print(counts)
        """)
    assert result.returncode == 0, result.stderr
    (maps_10, rss_10, fds_10), (maps_60, rss_60, fds_60) = eval(result.stdout.strip().splitlines()[-1])
    assert maps_60 == maps_10 and fds_60 == fds_10 and rss_60 - rss_10 < 2048, result.stdout


class _DLPackOnly:
    """A tensor of some other library that offers only DLPack (as JAX arrays do)."""

    def __init__(self, array, device_type=None):
        self.array, self.device_type = array, device_type

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (self.device_type, 0) if self.device_type is not None else self.array.__dlpack_device__()


def test_dlpack_producers_and_strided_arrays_are_taken(add_library, monkeypatch):
    """An object offering only __dlpack__ is read without a copy and its outputs come back
    through its library's from_dlpack; a strided NumPy input is copied once into a
    row-major one (as onnxruntime takes it); a DLPack tensor on another device, and a
    strided out= array (written in place), are refused with the reason."""
    import types
    module = byoc.load(add_library)
    x = np.arange(64, dtype=np.float32).reshape(4, 16)[:, ::2]
    want = x + x + np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(module.run(x), want)

    library = types.ModuleType("dlpack_only_arrays")
    library.from_dlpack = lambda tensor: _DLPackOnly(np.from_dlpack(tensor))
    monkeypatch.setitem(sys.modules, "dlpack_only_arrays", library)
    monkeypatch.setattr(_DLPackOnly, "__module__", "dlpack_only_arrays")
    got = module.run(_DLPackOnly(np.ascontiguousarray(x)))
    assert isinstance(got, _DLPackOnly)
    np.testing.assert_array_equal(np.from_dlpack(got), want)
    with pytest.raises(byoc.RuntimeError, match=r"input 'x': a DLPack tensor on device type 9"):
        module.run(_DLPackOnly(np.ascontiguousarray(x), device_type=9))
    def refuse(tensor):
        raise TypeError("no, thanks")
    library.from_dlpack = refuse
    with pytest.raises(byoc.RuntimeError, match=r"returning the outputs through .*from_dlpack raised TypeError: "
                                                 r"no, thanks; pass out= arrays"):
        module.run(_DLPackOnly(np.ascontiguousarray(x)))
    np.testing.assert_array_equal(module.run(x), want)  # the module keeps working
    strided_out = np.empty((4, 16), np.float32)[:, ::2]
    with pytest.raises(byoc.RuntimeError, match="contiguous"):
        module.run(x, out=strided_out)


@pytest.mark.parametrize("library_name", ["jax", "torch"])
def test_jax_and_torch_cpu_arrays_in_and_out(add_library, library_name, monkeypatch):
    """JAX arrays and torch CPU tensors (where installed) are taken as themselves and as
    __dlpack__-only wrappers; the outputs come back as the caller's kind."""
    import types
    lib = pytest.importorskip(library_name)
    module = byoc.load(add_library)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    want = x + x + np.arange(8, dtype=np.float32)
    if library_name == "jax":
        given = lib.device_put(x, lib.devices("cpu")[0])  # (a jax with CUDA puts arrays on the GPU)
        kind = type(given)
    else:
        given, kind = lib.from_numpy(x.copy()), lib.Tensor
    got = module.run(given)
    assert isinstance(got, kind), type(got)
    np.testing.assert_array_equal(np.asarray(got), want)
    wrappers = types.ModuleType("dlpack_only_arrays")
    wrappers.from_dlpack = lambda tensor: _DLPackOnly(np.from_dlpack(tensor))
    monkeypatch.setitem(sys.modules, "dlpack_only_arrays", wrappers)
    monkeypatch.setattr(_DLPackOnly, "__module__", "dlpack_only_arrays")
    wrapped = module.run(_DLPackOnly(given))
    assert isinstance(wrapped, _DLPackOnly)
    np.testing.assert_array_equal(np.from_dlpack(wrapped), want)


def test_byoc_runtime_error_is_also_the_builtin_one(add_library):
    """Code that catches RuntimeError around onnxruntime or torch catches byoc's too."""
    import builtins
    module = byoc.load(add_library)
    with pytest.raises(builtins.RuntimeError, match="input 'x'"):
        module.run(np.zeros((3, 8), np.float32))
    assert issubclass(byoc.RuntimeError, byoc.ByocError)


def test_a_library_of_several_variants_runs_the_one_its_inputs_fit(tmp_path):
    """The runtime's variants (model_runtime.h: VariantSpec, one program per set of input
    shapes over shared weights and memories): run() takes the variant whose input shapes
    the caller's tensors have, and names every shape it takes when none fits. Two programs
    y = x, of shapes (2, 3) and (4, 3), generated, compiled and linked as a build does."""
    import ctypes

    from byoc.codegen.host_plan import HostPlan, Ref
    from byoc.ir.types import TensorType
    from byoc.runtime.arrays import _DLTensor
    programs = []
    for rows in (2, 4):
        tensor = TensorType((rows, 3), "float32")
        copy = {"kind": "copy", "source": Ref("kInput", 0, tensor.nbytes), "destination": Ref("kOutput", 0, tensor.nbytes), "bytes": tensor.nbytes,
                "label": "#0 y = copy(x)", "symbol": "device_copy", "args": [], "results": [], "position": 0}
        plan = HostPlan(inputs=[("x", tensor)], outputs=[("y", tensor)], calls=[copy], output_copies=[],
                        input_copies=[], weights=b"")
        programs.append((plan, {"description": f"x of ({rows}, 3)"}))
    lib, model, host = _generated_library(tmp_path, programs)
    assert "// Variant 1: x of (4, 3)" in host

    def run(rows):
        x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
        y = np.zeros_like(x)
        tensors = []
        for array in (x, y):
            shape = (ctypes.c_int64 * 2)(*array.shape)
            tensors.append((_DLTensor(array.ctypes.data, (1, 0), 2, (2, 32, 1), shape, None, 0), shape))
        status = lib.byoc_model_run(model, ctypes.byref(tensors[0][0]), 1, ctypes.byref(tensors[1][0]), 1, None)
        return status, x, y
    for rows in (4, 2, 4):
        status, x, y = run(rows)
        assert status == 0, lib.byoc_last_error()
        np.testing.assert_array_equal(y, x)
    status, _, _ = run(3)
    assert status == 1
    assert lib.byoc_last_error().decode() == ("the inputs' shapes (x (3, 3)) are none of the shapes this model was "
                                              "built for: x (2, 3); x (4, 3)")
    assert run(2)[0] == 0  # still usable
    # an ndim no tensor has: named, its shape array not read past its end
    x = np.zeros((2, 3), np.float32)
    shape = (ctypes.c_int64 * 2)(2, 3)
    wrong = _DLTensor(x.ctypes.data, (1, 0), 1 << 30, (2, 32, 1), shape, None, 0)
    assert lib.byoc_model_run(model, ctypes.byref(wrong), 1, ctypes.byref(wrong), 1, None) == 1
    assert "x (1073741824 dims)" in lib.byoc_last_error().decode()
    lib.byoc_model_destroy(model)


@pytest.mark.parametrize("buckets", [
    pytest.param({"rows": [2, 4]}, id="outer-axis"),
    pytest.param({"cols": [3, 6]}, id="inner-axis"),
    pytest.param({"rows": [2, 4], "cols": [3, 6]}, id="two-axes"),
])
def test_padded_dims_run_in_the_smallest_bucket_that_holds_the_inputs(buckets, tmp_path):
    """Padded dims (model_padding.cc): an input of a size between buckets runs in the
    smallest bucket that holds it, copied into a buffer of the bucket's shape with zeros
    after it; each output's valid box is copied back. Programs y = x and z = x of shape
    (rows, cols, 4), generated, compiled and linked as a build does: whatever axes are
    padded (the outer one: one copy; an inner one: a 2-D copy; both: one per row), y is x."""
    import ctypes
    import itertools

    from byoc.codegen.host_plan import HostPlan, Ref
    from byoc.ir.types import TensorType
    from byoc.runtime.arrays import _DLTensor
    names = sorted(buckets)
    programs = []
    for sizes in itertools.product(*(buckets[n] for n in names)):
        dims = dict(zip(names, sizes))
        shape = (dims.get("rows", 4), dims.get("cols", 6), 4)
        tensor = TensorType(shape, "float32")
        calls = [{"kind": "copy", "source": Ref("kInput", 0, tensor.nbytes), "destination": Ref("kOutput", k, tensor.nbytes),
                  "bytes": tensor.nbytes,
                  "label": f"#{k} copy", "symbol": "device_copy", "args": [], "results": [], "position": k}
                 for k in range(2)]
        plan = HostPlan(inputs=[("x", tensor)], outputs=[("y", tensor), ("z", tensor)], calls=calls,
                        output_copies=[], input_copies=[], weights=b"")
        axes = ["rows" if "rows" in dims else None, "cols" if "cols" in dims else None, None]
        programs.append((plan, {"description": f"x of {shape}", "axis_dims": [axes] * 3, "dims": dims}))
    lib, model, _ = _generated_library(tmp_path, programs, padded_dims=names)

    def tensor_of(array):
        shape = (ctypes.c_int64 * 3)(*array.shape)
        return _DLTensor(array.ctypes.data, (1, 0), 3, (2, 32, 1), shape, None, 0), shape

    def run(shape):
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        outputs = [np.full(shape, np.nan, np.float32) for _ in range(2)]
        x_tensor = tensor_of(x)
        held = [tensor_of(o) for o in outputs]
        output_array = (_DLTensor * 2)(*[t for t, _ in held])
        status = lib.byoc_model_run(model, ctypes.byref(x_tensor[0]), 1, output_array, 2, None)
        return status, x, outputs
    rows = [1, 2, 3, 4] if "rows" in buckets else [4]
    cols = [1, 3, 5, 6] if "cols" in buckets else [6]
    for shape in [(r, c, 4) for r in rows for c in cols] + [(rows[0], cols[0], 4)]:
        status, x, (y, z) = run(shape)
        assert status == 0, (shape, lib.byoc_last_error())
        np.testing.assert_array_equal(y, x)
        np.testing.assert_array_equal(z, x)
    for too_big in [(rows[-1] + 1, cols[-1], 4), (rows[-1], cols[-1] + 1, 4), (rows[-1], cols[-1], 5),
                    (0, cols[-1], 4)]:
        status, _, _ = run(too_big)
        assert status == 1, too_big
        message = lib.byoc_last_error().decode()
        assert "fit none of the shapes this model was built for" in message, message
        assert ", ".join(f"{n} from 1 to {max(buckets[n])}" for n in names) in message, message
    assert run((rows[-1], cols[-1], 4))[0] == 0  # still usable
    lib.byoc_model_destroy(model)


def _generated_library(tmp_path, programs, padded_dims=()):
    """A library of `programs` (per variant: its HostPlan and HostVariant's other keyword
    arguments), its host code generated, compiled and linked with the model runtime as a
    build does: (the loaded library, a created model, the host source)."""
    import ctypes

    from byoc.codegen.host import HostVariant, blob_checksum, render_blob_assembly, render_host
    from byoc.codegen.program_table import program_table
    from byoc.runtime import C_ABI_HEADER, model_runtime_sources
    from byoc.target import Target
    from byoc.toolchain import CompileUnit, compile_units, link_shared

    def embedded(name, symbol, data):
        (tmp_path / f"{name}.bin").write_bytes(data)
        (tmp_path / f"{name}.S").write_text(render_blob_assembly(f"{name}.bin", symbol, name))
        return CompileUnit(source=tmp_path / f"{name}.S", language="asm", flags=[f"-Wa,-I,{tmp_path}"],
                           output=f"{name}.o", dependencies=[tmp_path / f"{name}.bin"])
    variants, units = [], []
    for number, (plan, options) in enumerate(programs):
        program = program_table(plan)
        units.append(embedded(f"program{number}", f"byoc_program_table_{number}", program))
        variants.append(HostVariant(plan, program, program_symbol=f"byoc_program_table_{number}", **options))
    units += [embedded("metadata", "byoc_metadata_json", b"{}")]
    host = render_host(variants, cuda=False, build_id="0123456789abcdef", arch_number=None, weights_embedded=True,
                       weights_bytes=0, weights_checksum=blob_checksum(b""), padded_dims=padded_dims)
    (tmp_path / "host.cc").write_text(host)
    flags = Target("cpu").cxx_flags() + [f"-I{C_ABI_HEADER.parent}"]
    units.append(CompileUnit(source=tmp_path / "host.cc", language="cxx", flags=flags, output="host.o"))
    units += [CompileUnit(source=source, language="cxx", flags=flags + ["-DBYOC_RUNTIME_CUDA=0"],
                          output=f"{source.stem}.o") for source in model_runtime_sources(False)]
    library = link_shared(compile_units(units, tmp_path), tmp_path / "model.so", [], [])
    lib = ctypes.CDLL(str(library))
    lib.byoc_last_error.restype = ctypes.c_char_p
    model = ctypes.c_void_p()
    assert lib.byoc_model_create(ctypes.byref(model), None) == 0, lib.byoc_last_error()
    return lib, model, host
