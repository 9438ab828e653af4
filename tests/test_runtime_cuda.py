"""The cuda runtime under misuse and concurrency (gpu tests, run on the lent H100):
out-of-range Gather indices are clamped and reported, model instances of one .so are
independent (JSON engines included), CUDA graph capture survives other threads' work on
the legacy default stream, and closed modules leave nothing mapped."""
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from test_build_cuda import FIXTURES, gpu, needs_nvcc  # the same GPU and nvcc probes
from test_runtime_checks import _DLPackOnly  # a tensor of a library that offers only DLPack

VOCABULARY, WIDTH, TOKENS = 500, 16, 8


def embedding_model():
    """y = table[ids] * 2: a Gather from a constant table by a caller's int64 indices."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [TOKENS])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [TOKENS, WIDTH])
    table = np.arange(VOCABULARY * WIDTH, dtype=np.float32).reshape(VOCABULARY, WIDTH)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embedding"),
             helper.make_node("Add", ["rows", "rows"], ["y"])]
    graph = helper.make_graph(nodes, "g", [ids], [y], [numpy_helper.from_array(table, "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), table


@needs_nvcc
def test_gather_reporting_compiles_into_the_host_code(tmp_path):
    """The cuda model runtime, which hands the shim its status word, is linked in, and the
    call table labels the calls it numbers (CI: no GPU)."""
    model, _ = embedding_model()
    library = byoc.build(model, target="cuda -arch=sm_90", config={"backends": ["builtin"]},
                         workdir=str(tmp_path / "w"))
    from byoc.codegen.program_table import read_program_table
    calls = read_program_table((tmp_path / "w" / "program.bin").read_bytes())["calls"]
    assert calls[0]["label"].startswith("#0 ")  # the first call's label, as its reports name it
    assert "model_runtime_cuda.o" in (tmp_path / "w" / "build.ninja").read_text()
    symbols = subprocess.run(["nm", str(library.path)], capture_output=True, text=True).stdout
    assert " byoc_current_run_status" in symbols


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_out_of_range_gather_indices_are_clamped_and_reported(cuda_graph, tmp_path):
    import cupy
    model, table = embedding_model()
    module = byoc.build(model, target="cuda -arch=sm_90", config={"backends": ["builtin"], "cuda_graph": cuda_graph},
                        workdir=str(tmp_path / "w")).load()
    good = np.array([0, 1, 499, -1, -500, 7, 8, 9], dtype=np.int64)
    for _ in range(3):  # direct, captured, replayed
        np.testing.assert_array_equal(cupy.asnumpy(module.run(cupy.asarray(good))), table[good] * 2)
    module.synchronize()
    for bad_index in (-2**31, -VOCABULARY - 1, VOCABULARY, 2**31 - 1, 2**62, -2**62):
        bad = good.copy()
        bad[3] = bad_index
        out = cupy.asnumpy(module.run(cupy.asarray(bad)))
        clamped = 0 if bad_index < 0 else VOCABULARY - 1
        np.testing.assert_array_equal(out[3], table[clamped] * 2)  # the nearest row, nothing outside
        with pytest.raises(byoc.RuntimeError, match=r"read indices out of range in call #\d+ .*embedding|"
                                                    r"read indices out of range in call"):
            module.synchronize()
        module.synchronize()  # reported once
        np.testing.assert_array_equal(cupy.asnumpy(module.run(cupy.asarray(good))), table[good] * 2)
    # without synchronize(): the next run() says so, then the model goes on
    module.run(cupy.asarray(np.full(TOKENS, VOCABULARY, np.int64)))
    cupy.cuda.runtime.deviceSynchronize()
    with pytest.raises(byoc.RuntimeError, match="out of range"):
        module.run(cupy.asarray(good))
    np.testing.assert_array_equal(cupy.asnumpy(module.run(cupy.asarray(good))), table[good] * 2)


@pytest.mark.gpu
@gpu
def test_json_engine_instances_of_one_library_are_independent(tmp_path):
    import cupy
    data = np.load(FIXTURES / "mlp.npz")
    inputs = {k[3:]: cupy.asarray(data[k]) for k in data if k.startswith("in_")}
    want = next(data[k] for k in data if k.startswith("out_"))
    library = byoc.build(FIXTURES / "mlp.onnx", target="cuda -arch=sm_90",
                         config={"backends": ["cublaslt", "builtin"]}, workdir=str(tmp_path / "w"))
    assert "cublaslt" in library.metadata["backends"]
    first, second = library.load(), byoc.load(library.path)

    def check(module):
        got = cupy.asnumpy(module.run(**inputs))
        assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want))
    check(first)
    check(second)
    first.close()
    check(second)
    third = byoc.load(library.path)
    second.close()
    check(third)


def _concurrent_runs(library_path, modules_per_thread, shared, runs, inputs, want, cupy_noise=True):
    """8 threads run their own Modules (or one shared Module) `runs` times each, while two
    more threads keep CuPy and torch busy on their default (legacy) streams. Threads that
    share a Module share its arena: they queue on one stream, as Module's contract asks
    (runs on different streams would overlap on the GPU, whatever order the lock gives)."""
    import cupy
    errors, stop = [], threading.Event()
    shared_module = byoc.load(library_path) if shared else None
    shared_stream = cupy.cuda.Stream(non_blocking=True) if shared else None

    def noise_cupy():
        a = cupy.ones((512, 512), cupy.float32)
        while not stop.is_set():
            (a @ a).sum()
            cupy.cuda.Stream.null.synchronize()

    def noise_torch():
        import torch
        a = torch.ones((512, 512), device="cuda")
        while not stop.is_set():
            (a @ a).sum().item()

    def worker(index):
        try:
            modules = [shared_module] if shared else [byoc.load(library_path) for _ in range(modules_per_thread)]
            stream = shared_stream or cupy.cuda.Stream(non_blocking=index % 2 == 0)
            with stream:
                x = {k: cupy.asarray(v) for k, v in inputs.items()}
                for step in range(runs):
                    module = modules[step % len(modules)]
                    got = module.run(**x)
                    if step % 50 == 0 or step == runs - 1:
                        got = cupy.asnumpy(got)
                        if np.max(np.abs(got.astype(np.float32) - want)) > 2e-2 * np.max(np.abs(want)):
                            errors.append(f"thread {index} step {step}: wrong output")
                            return
            if not shared:
                for module in modules:
                    module.close()
        except Exception as error:  # noqa: BLE001 - reported below with the thread's index
            errors.append(f"thread {index}: {type(error).__name__}: {error}")
    noise = [threading.Thread(target=noise_cupy)]
    try:
        import torch  # noqa: F401
        noise.append(threading.Thread(target=noise_torch))
    except ImportError:
        pass
    for thread in noise:
        thread.start()
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    for thread in noise:
        thread.join()
    if shared_module is not None:
        shared_module.close()
    return errors


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("shared", [False, True], ids=["8x8 modules", "one shared module"])
def test_threads_with_graphs_and_legacy_stream_work_beside_them(cuda_graph, shared, tmp_path):
    data = np.load(FIXTURES / "mlp.npz")
    inputs = {k[3:]: data[k] for k in data if k.startswith("in_")}
    want = next(data[k] for k in data if k.startswith("out_"))
    library = byoc.build(FIXTURES / "mlp.onnx", target="cuda -arch=sm_90",
                         config={"backends": ["cublaslt", "builtin"], "cuda_graph": cuda_graph},
                         workdir=str(tmp_path / "w"))
    errors = _concurrent_runs(library.path, modules_per_thread=8, shared=shared, runs=1000, inputs=inputs, want=want)
    assert not errors, errors[:5]


@pytest.mark.gpu
@gpu
def test_closed_cuda_modules_leave_no_mapping_behind(tmp_path):
    """Load, run and close 40 copies of a cuda library in one process: the mappings and
    open files stop growing once the CUDA libraries are in."""
    data = np.load(FIXTURES / "mlp.npz")
    library = byoc.build(FIXTURES / "mlp.onnx", target="cuda -arch=sm_90",
                         config={"backends": ["cublaslt", "builtin"], "cuda_graph": True},
                         workdir=str(tmp_path / "w"))
    np.savez(tmp_path / "inputs.npz", **{k[3:]: data[k] for k in data if k.startswith("in_")})
    code = f"""
        import os, shutil, numpy as np, cupy, byoc
        inputs = {{k: cupy.asarray(v) for k, v in np.load({str(tmp_path / 'inputs.npz')!r}).items()}}
        def counts():
            rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
            return sum(1 for _ in open("/proc/self/maps")), len(os.listdir("/proc/self/fd")), rss
        seen = []
        for i in range(40):
            copy = {str(tmp_path)!r} + f"/copy_{{i}}.so"
            shutil.copy({str(library.path)!r}, copy)
            module = byoc.load(copy)
            for _ in range(3):
                module.run(**inputs)
            module.synchronize()
            module.close()
            os.unlink(copy)
            if i in (9, 39):
                seen.append(counts())
        print(seen)
        """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (maps_10, fds_10, rss_10), (maps_40, fds_40, rss_40) = eval(result.stdout.strip().splitlines()[-1])
    assert maps_40 <= maps_10 + 4 and fds_40 <= fds_10 and rss_40 - rss_10 < 5 * 1024, result.stdout


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("library_name", ["cupy", "torch"])
def test_cuda_arrays_in_and_out_as_themselves_and_as_dlpack_only_wrappers(library_name, tmp_path, monkeypatch):
    """CuPy arrays and torch CUDA tensors are taken as themselves and as __dlpack__-only
    wrappers (the CUDA device type); the outputs come back as the caller's kind."""
    import types
    lib = pytest.importorskip(library_name)
    model, table = embedding_model()
    library = byoc.build(model, config={"target": "auto", "backends": ["builtin"]}, workdir=str(tmp_path / "w"))
    module = library.load()
    ids = np.arange(TOKENS, dtype=np.int64) * 7
    want = table[ids] * 2
    given = lib.asarray(ids) if library_name == "cupy" else lib.from_numpy(ids).cuda()
    got = module.run(given)
    assert type(got) is type(given)
    as_numpy = (lambda a: lib.asnumpy(a)) if library_name == "cupy" else (lambda a: a.cpu().numpy())
    np.testing.assert_array_equal(as_numpy(got), want)
    wrappers = types.ModuleType("dlpack_only_cuda_arrays")
    wrappers.from_dlpack = lambda tensor: _DLPackOnly(lib.from_dlpack(tensor))
    monkeypatch.setitem(sys.modules, "dlpack_only_cuda_arrays", wrappers)
    monkeypatch.setattr(_DLPackOnly, "__module__", "dlpack_only_cuda_arrays")
    wrapped = module.run(_DLPackOnly(given))
    assert isinstance(wrapped, _DLPackOnly)
    np.testing.assert_array_equal(as_numpy(wrapped.array), want)


@pytest.mark.gpu
@gpu
def test_a_device_tensor_the_kernels_would_read_misaligned_is_refused_by_name(tmp_path):
    """Without CUDA graphs the kernels write the caller's output in place: one that starts
    4 bytes past a 16-byte boundary (a view into another array) is refused by name before
    any kernel runs, not left to fault the process's CUDA context; the module goes on."""
    import cupy
    model, table = embedding_model()
    module = byoc.build(model, target="cuda -arch=sm_90", config={"backends": ["builtin"], "cuda_graph": False},
                        workdir=str(tmp_path / "w")).load()
    ids = np.arange(TOKENS, dtype=np.int64) * 3
    misaligned = cupy.zeros(TOKENS * WIDTH + 1, cupy.float32)[1:].reshape(TOKENS, WIDTH)
    assert misaligned.data.ptr % 16 == 4
    with pytest.raises(byoc.RuntimeError, match=r"output 'y' \(#0\): its data starts 4 bytes past a 16-byte "
                                                r"boundary; expected a 16-byte aligned device tensor"):
        module.run(cupy.asarray(ids), out=misaligned)
    module.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(module.run(cupy.asarray(ids))), table[ids] * 2)


def _device_count() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy or no driver: the gpu tests skip anyway
        return 0


@pytest.mark.gpu
@gpu
def test_a_module_on_a_named_device(tmp_path):
    """device=: the model's memory and runs on that device, whatever the thread's current
    one; a device that does not exist, a tensor or a stream of another device are refused
    with both devices named; device=None keeps the current device (as before)."""
    import cupy
    data = np.load(FIXTURES / "mlp.npz")
    want = next(data[k] for k in data if k.startswith("out_"))
    library = byoc.build(FIXTURES / "mlp.onnx", target="cuda -arch=sm_90",
                         config={"backends": ["cublaslt", "builtin"], "cuda_graph": True}, workdir=str(tmp_path / "w"))
    count = _device_count()
    last = count - 1
    with cupy.cuda.Device(last):
        inputs = {k[3:]: cupy.asarray(data[k]) for k in data if k.startswith("in_")}
    with cupy.cuda.Device(0):  # the thread's current device is another one (with two GPUs)
        module = library.load(device=last)
        for _ in range(3):  # direct, captured, replayed
            got = module.run(**inputs)
            assert got.device.id == last
            assert np.max(np.abs(cupy.asnumpy(got) - want)) <= 1e-3 * np.max(np.abs(want))
        module.synchronize()
        assert cupy.cuda.runtime.getDevice() == 0  # the runtime put the thread's device back
    with pytest.raises(byoc.RuntimeError, match=f"device {count}: expected a CUDA device from 0 to {last} "
                                                f"\\(this process sees {count}"):
        library.load(device=count)
    if count < 2:
        return
    with cupy.cuda.Device(0):
        elsewhere = {k[3:]: cupy.asarray(data[k]) for k in data if k.startswith("in_")}
        stream = cupy.cuda.Stream(non_blocking=True)
    with pytest.raises(byoc.RuntimeError, match=f"is on CUDA device 0; this model runs on device {last}"):
        module.run(**elsewhere)
    with pytest.raises(byoc.RuntimeError, match=f"the stream given is on CUDA device 0; this model runs on device {last}"):
        module.run(**inputs, stream=stream)
    assert np.max(np.abs(cupy.asnumpy(module.run(**inputs)) - want)) <= 1e-3 * np.max(np.abs(want))


@pytest.mark.gpu
@gpu
@pytest.mark.skipif(_device_count() < 2, reason="needs two GPUs")
def test_two_modules_of_one_library_on_two_devices_at_once(tmp_path):
    """One module per GPU, each run from its own thread over fresh inputs, outputs checked
    against the float32 reference: each on its device (its outputs' pointers are there)."""
    import cupy
    data = np.load(FIXTURES / "bert2.npz")
    host_inputs = {k[3:]: data[k] for k in data if k.startswith("in_")}
    wants = [data[k] for k in data if k.startswith("out_")]
    library = byoc.build(FIXTURES / "bert2.onnx", target="cuda -arch=sm_90",
                         config={"backends": ["cutlass", "cublaslt", "builtin"], "cuda_graph": True,
                                 "precision": "float16"},
                         workdir=str(tmp_path / "w"), input_shapes={k: v.shape for k, v in host_inputs.items()})
    modules = [library.load(device=device) for device in (0, 1)]
    errors = []

    def work(device):
        try:
            with cupy.cuda.Device(device):
                device_inputs = {k: cupy.asarray(v) for k, v in host_inputs.items()}
                for _ in range(50):
                    got = modules[device].run(**device_inputs)
                    got = got if isinstance(got, tuple) else (got,)
                    assert all(array.device.id == device for array in got)
                    assert cupy.cuda.runtime.pointerGetAttributes(got[0].data.ptr).device == device
                for array, want in zip(got, wants):
                    assert np.max(np.abs(cupy.asnumpy(array) - want)) <= 2e-2 * np.max(np.abs(want)), device
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append((device, error))
    threads = [threading.Thread(target=work, args=(device,)) for device in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
