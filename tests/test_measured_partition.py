"""partition: measured (#43): every backend's matches and the built-in backend's ops are
candidates, each timed built alone (here on the cpu target: cuBLASLt's JSON engine and the
built-in backend both run there) or read from the cost store; the cheapest cover is built
and explained. The store decides a later build, whatever the costs say; without a way to
measure and nothing stored, the build falls back to the priority order and says so."""
import json
from pathlib import Path

import numpy as np
import pytest

import byoc
from byoc import pipeline
from byoc.costs import CostStore, candidate_module, device_fingerprint
from byoc.target import Target
from test_refit import scaled_model

FIXTURES = Path(__file__).parent / "fixtures"
MEASURED = {"target": "cpu", "backends": ["cublaslt", "builtin"], "partition": "measured"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def mlp_case():
    data = np.load(FIXTURES / "mlp.npz")
    return ({k[3:]: data[k] for k in data if k.startswith("in_")},
            next(data[k] for k in data if k.startswith("out_")))


def test_a_measured_build_times_each_candidate_once_and_explains_its_choice(cache, tmp_path):
    inputs, want = mlp_case()
    library = byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "first"))
    assert np.max(np.abs(library.load().run(**inputs) - want)) <= 1e-4 * np.max(np.abs(want))
    measured = library.report.to_json()["measured"]
    assert measured["cost_us"] > 0 and len(measured["decisions"]) == 3  # the three dense layers
    for decision in measured["decisions"]:
        names = {a["candidate"] for a in decision["alternatives"]} | {decision["chosen"]}
        assert {"cublaslt.dense_bias", "builtin.ops of dense_bias"} <= names or \
            {"cublaslt.dense", "builtin.op"} <= names, decision
        assert all(a["cover_us"] is None or a["cover_us"] >= decision["cover_us"] for a in decision["alternatives"])
    text = (tmp_path / "first" / "partition_report.txt").read_text()
    assert "chosen by measurement" in text and " us (cover " in text
    store = json.loads((cache / "costs" / "costs.json").read_text())
    device = device_fingerprint(Target("cpu"))
    entries = store["entries"][device]
    assert len(entries) >= 10 and all(e["us"] > 0 for e in entries.values())
    assert {e["backend"] for e in entries.values()} == {"cublaslt", "builtin"}
    # the same build again: everything from the store, nothing built for measuring
    again = byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "second"))
    assert again.report.to_json()["measured"]["cost_us"] == measured["cost_us"]
    assert json.loads((cache / "costs" / "costs.json").read_text()) == store


@pytest.mark.parametrize("cheap", ["cublaslt", "builtin"])
def test_the_stored_costs_decide_the_partition(cheap, cache, tmp_path):
    """With the store's costs rewritten so that one backend is 100x cheaper, every dense
    layer goes to it (a whole model's worth of alternatives weighed, not a priority)."""
    byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "measure"))
    path = cache / "costs" / "costs.json"
    store = json.loads(path.read_text())
    for entries in store["entries"].values():
        for entry in entries.values():
            entry["us"] = 1.0 if entry["backend"] == cheap else 100.0
    path.write_text(json.dumps(store))
    library = byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "chosen"))
    measured = library.report.to_json()["measured"]
    assert measured["decisions"] and not measured["notes"]  # chosen by the costs, no fallback
    backends = library.report.to_json()["backends"]
    if cheap == "cublaslt":
        assert backends["cublaslt"]["ops_covered"]["matmul"] == 3
    else:
        assert "cublaslt" not in backends or backends["cublaslt"]["partitions"] == 0
    inputs, want = mlp_case()
    assert np.max(np.abs(library.load().run(**inputs) - want)) <= 1e-4 * np.max(np.abs(want))


def test_without_a_way_to_measure_and_nothing_stored_the_priority_order_is_used_and_said(cache, tmp_path):
    """A cuda build on a machine whose GPU (if any) is not the target's arch cannot time
    candidates: with an empty store it partitions as priority would, and the report says so."""
    config = {**MEASURED, "target": "cuda -arch=sm_80"}
    measured = pipeline.lower(FIXTURES / "mlp.onnx", config, until="partition", workdir=tmp_path / "m")
    priority = pipeline.lower(FIXTURES / "mlp.onnx", {**config, "partition": "priority"}, until="partition",
                              workdir=tmp_path / "p")
    report = measured.attrs["partition_report"]
    assert any("3 of 3 regions" in note and "no GPU of its arch" in note and "the priority order there" in note
               for note in report.to_json()["measured"]["notes"])
    assert measured.script(elide_data_over=16) == priority.script(elide_data_over=16)
    assert not (cache / "costs" / "costs.json").exists()


def test_a_candidate_module_is_the_ops_alone_with_canonical_names(tmp_path):
    """The same ops of two layers are one candidate (one key, measured once); a scalar of
    another value is another; repeated() copies are not merged by the candidate's build."""
    from byoc.config import load_config
    from byoc.costs import candidate_key, repeated
    data = np.load(FIXTURES / "bert2.npz")
    shapes = {k[3:]: data[k].shape for k in data if k.startswith("in_")}
    main = pipeline.lower(FIXTURES / "bert2.onnx", "cpu", until="simplify", input_shapes=shapes)["main"]
    config = load_config("cpu")
    signatures = {}
    for position, binding in enumerate(main.bindings):
        if binding.value.op.name == "matmul":
            signatures.setdefault(tuple(str(a.type) for a in binding.value.args), []).append(position)
    positions = next(p for p in signatures.values() if len(p) >= 2)
    first, reads = candidate_module(main, frozenset([positions[0]]))
    second, _ = candidate_module(main, frozenset([positions[1]]))
    text = first.script(elide_data_over=16)
    assert text == second.script(elide_data_over=16) and "%v0 = matmul(%p0" in text and len(reads) >= 1
    assert candidate_key(first, "builtin", config) == candidate_key(second, "builtin", config)
    assert candidate_key(first, "builtin", config) != candidate_key(first, "cublaslt", config)
    keys = []
    for scale in (2.0, 3.0):
        scaled_model(scale, tmp_path / f"scaled{scale}.onnx")  # a weight of one element, compiled into the kernel
        scaled = pipeline.lower(tmp_path / f"scaled{scale}.onnx", "cpu", until="simplify")["main"]
        module, _ = candidate_module(scaled, frozenset(range(len(scaled.bindings))))
        keys.append(candidate_key(module, "builtin", config))
    assert keys[0] != keys[1]
    copies = pipeline.lower(repeated(first, 4), "cpu", until="simplify")["main"]
    assert sum(1 for b in copies.bindings if b.value.op.name == "matmul") == 4 and len(copies.params) == 4 * len(reads)


def failing_cublaslt_builds(monkeypatch, error: Exception, first_only: bool = False) -> list:
    """costs.build_candidate raising `error` for cublaslt candidates (only the first one
    built, with `first_only`), the others built as usual; the backends of every candidate
    build asked for, in order."""
    from byoc import costs
    real, calls = costs.build_candidate, []

    def build(module, backend, context, *args):
        calls.append(backend)
        if backend == "cublaslt" and (not first_only or calls.count("cublaslt") == 1):
            raise error
        return real(module, backend, context, *args)
    monkeypatch.setattr(costs, "build_candidate", build)
    return calls


def test_a_candidate_that_fails_is_left_out_remembered_and_not_measured_again(cache, tmp_path, monkeypatch):
    """Whatever a candidate's build raises (not only a ByocError), the build goes on without
    it, the report says why, and the store keeps the failure so that it is not retried."""
    calls = failing_cublaslt_builds(monkeypatch, RuntimeError("the engine fell over"))
    inputs, want = mlp_case()
    library = byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "first"))
    assert np.max(np.abs(library.load().run(**inputs) - want)) <= 1e-4 * np.max(np.abs(want))
    report = library.report.to_json()
    assert "cublaslt" not in report["backends"] or report["backends"]["cublaslt"]["partitions"] == 0
    assert any(r["backend"] == "cublaslt" and "measuring it failed: RuntimeError: the engine fell over" in r["reason"]
               for r in report["refused"])
    count = len(calls)
    byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "second"))
    assert len(calls) == count  # nothing measured again, the failures included


def test_a_failure_of_the_moment_is_not_remembered(cache, tmp_path, monkeypatch):
    """A candidate that fails for the machine's state (out of memory, a timeout) is left to
    the priority order in this build and measured again in the next; one that fails for
    itself is remembered (the test above)."""
    from byoc import costs
    calls = failing_cublaslt_builds(monkeypatch, RuntimeError("CUDA error: out of memory (cudaErrorMemoryAllocation)"),
                                    first_only=True)
    inputs, want = mlp_case()
    library = byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "first"))
    assert np.max(np.abs(library.load().run(**inputs) - want)) <= 1e-4 * np.max(np.abs(want))
    assert not [e for device in costs.CostStore().entries.values() for e in device.values() if "failed" in e]
    first = calls.count("cublaslt")
    byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "second"))
    assert calls.count("cublaslt") == first + 1  # measured again, this time for good
    assert costs.transient_failure(MemoryError()) and not costs.transient_failure(RuntimeError("illegal address"))


def test_a_cuda_candidates_key_holds_the_toolkit_and_libraries_and_its_entry_says_where_it_was_measured(
        tmp_path, monkeypatch):
    """The cost store is keyed by what a cost depends on: another cuDNN version is another
    key for the cudnn backend's candidates (another CUDA or cuBLAS for every cuda one), so a
    cost measured with the old libraries is not taken; the cpu's keys do not depend on them.
    Each entry records byoc's code and the toolchain."""
    import byoc.toolchain.locate as locate
    from byoc.config import load_config
    from byoc.costs import CostStore, candidate_key, provenance, toolchain_versions
    main = pipeline.lower(FIXTURES / "mlp.onnx", "cpu", until="simplify")["main"]
    module, _ = candidate_module(main, frozenset([0]))
    cuda, cpu = load_config("cuda_sm90"), load_config("cpu")
    keys = {"cudnn": [], "builtin": []}
    for cudnn in ("9.28.1", "9.29.0"):
        locate.cuda_library_versions.cache_clear()
        monkeypatch.setattr(locate, "_header_version",
                            lambda header, prefix, names, cudnn=cudnn: cudnn if header == "cudnn_version.h" else "13.10.0")
        for backend in keys:
            keys[backend].append(candidate_key(module, backend, cuda, Target("cuda -arch=sm_90")))
        assert f"cublas 13.10.0, cudnn {cudnn}" in provenance(Target("cuda -arch=sm_90"), "cudnn")["toolchain"]
        assert "cudnn" not in provenance(Target("cuda -arch=sm_90"), "builtin")["toolchain"]
    locate.cuda_library_versions.cache_clear()
    assert keys["cudnn"][0] != keys["cudnn"][1]  # another cuDNN: the cudnn candidate is measured again
    assert keys["builtin"][0] == keys["builtin"][1]  # the other backends' costs are kept
    assert toolchain_versions(Target("cpu")) == "" and "toolchain" not in provenance(Target("cpu"))
    assert candidate_key(module, "builtin", cpu) == candidate_key(module, "builtin", cpu, Target("cpu"))
    store = CostStore(tmp_path / "costs.json")
    store.record("cpu:x", "k", 1.0, "builtin", "add", provenance(Target("cpu")))
    assert set(store.entries["cpu:x"]["k"]) >= {"us", "byoc", "date", "backend", "ops"}


def test_partition_is_a_config_key_with_two_values():
    from byoc.config import load_config
    from byoc.errors import ConfigError
    assert load_config("cpu").partition == "priority"
    assert load_config({"partition": "measured"}).to_dict()["partition"] == "measured"
    with pytest.raises(ConfigError, match="partition"):
        load_config({"partition": "fastest"})


def test_an_unreadable_store_is_a_warning_and_measuring_goes_on(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text("{not json")
    with pytest.warns(byoc.ByocWarning):
        store = CostStore(path)
    assert store.entries == {}
    store.record("cpu:x", "key", 12.0, "builtin", "matmul")
    store.save()
    assert CostStore(path).lookup("cpu:x", "key") == 12.0


def test_the_search_runs_over_the_contested_ops_with_their_reach_through_the_others():
    """a(0) -> x(1) -> b(2), c(3) -> d(4) with x uncontested: a reaches b through x (a cycle
    a later choice could close passes there), c reaches d directly, nothing else."""
    from byoc.transform.measured_partition import contested_edges
    edges = [(0, 1), (1, 2), (3, 4), (2, 5)]
    assert contested_edges(6, edges, {0: 0, 2: 1, 3: 2, 4: 3}) == [(0, 1), (2, 3)]
    assert contested_edges(6, edges, {0: 0, 5: 1}) == [(0, 1)]  # through two of the others
    assert contested_edges(6, edges, {}) == []


def test_byoc_tuning_shows_exports_and_merges_cost_stores(cache, tmp_path, capsys):
    from byoc.cli import main
    from byoc.costs import default_store_path
    store = CostStore(default_store_path())
    store.record("cpu:a", "k1", 10.0, "builtin", "matmul, add")
    store.record("cpu:a", "k2", 20.0, "cublaslt", "matmul")
    store.save()
    assert main(["tuning", "show"]) == 0
    shown = capsys.readouterr().out
    assert "2 candidate costs (partition: measured)" in shown and "cublaslt: matmul  20.00 us" in shown
    assert main(["tuning", "export", "--costs", "-o", str(tmp_path / "mine.json")]) == 0
    other = CostStore(tmp_path / "team.json")
    other.record("cpu:a", "k2", 15.0, "cublaslt", "matmul")
    other.record_failed("cpu:a", "k1", "RuntimeError: no", "builtin", "matmul, add")
    other.record("cuda:H100:cuda -arch=sm_90", "k3", 3.0, "cutlass", "matmul")
    other.save()
    assert main(["tuning", "merge", str(tmp_path / "team.json")]) == 0
    merged = CostStore(default_store_path())
    assert merged.lookup("cpu:a", "k2") == 15.0  # the later store's
    assert merged.lookup("cpu:a", "k1") == 10.0  # a failure elsewhere does not replace a time
    assert merged.lookup("*:cuda -arch=sm_90", "k3") == 3.0  # any GPU's, for a build that cannot measure
    assert CostStore(tmp_path / "mine.json").lookup("cpu:a", "k2") == 20.0
    from byoc.backends.cutlass.tuning import SHIPPED_DATABASE
    assert main(["tuning", "merge", str(tmp_path / "team.json"), str(SHIPPED_DATABASE)]) == 2
    assert "not all of one kind" in capsys.readouterr().err


def test_regions_without_a_cost_take_the_priority_order_and_the_rest_is_chosen_by_cost(cache, tmp_path, monkeypatch):
    """A store that knows every candidate but those of the last dense layer, on a machine that
    cannot measure: that layer goes to cuBLASLt (first in the priority order), the others to
    the backend the store says is cheaper (the built-in one), and the report says which."""
    from byoc import costs
    byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "measure"))
    path = cache / "costs" / "costs.json"
    store = json.loads(path.read_text())
    for entries in store["entries"].values():
        for entry in entries.values():
            entry["us"] = 1.0 if entry["backend"] == "builtin" else 100.0
    path.write_text(json.dumps(store))
    mod = pipeline.lower(FIXTURES / "mlp.onnx", {**MEASURED, "partition": "priority"}, until="pin_devices")
    from byoc.costs import candidate_key
    from byoc.config import load_config
    from byoc.transform.pattern_candidates import pattern_candidates
    main = mod["main"]
    last_layer = max(pattern_candidates(mod, ["cublaslt"]), key=lambda m: m.root).nodes
    forget = set()
    for nodes in [last_layer] + [frozenset([n]) for n in last_layer]:
        module, _ = candidate_module(main, nodes)
        forget |= {candidate_key(module, b, load_config(MEASURED)) for b in ("cublaslt", "builtin")}
    for entries in store["entries"].values():
        for key in forget:
            entries.pop(key, None)
    path.write_text(json.dumps(store))
    monkeypatch.setattr(costs, "can_measure", lambda target: False)
    library = byoc.build(FIXTURES / "mlp.onnx", config=MEASURED, workdir=str(tmp_path / "chosen"))
    report = library.report.to_json()
    assert any("1 of 3 regions" in note and "the priority order there" in note for note in report["measured"]["notes"])
    assert report["backends"]["cublaslt"]["partitions"] == 1  # the last layer only
    inputs, want = mlp_case()
    assert np.max(np.abs(library.load().run(**inputs) - want)) <= 1e-4 * np.max(np.abs(want))


@pytest.mark.parametrize("name", ["bert", "resnet50", "mobilenet_v2"])
def test_with_no_cost_anywhere_the_choice_is_the_priority_orders_exactly(name):
    """Every region forced (no cost known): the composites are FuseOpsByPattern's, op for
    op, on corpus models for the cuda backends (CUTLASS's NHWC convs included)."""
    from byoc.backend import get_backend
    from byoc.report import PartitionReport
    from byoc.transform.fuse_ops_by_pattern import fuse_ops_by_pattern
    from byoc.transform.lower_split import lower_split
    from byoc.transform.measured_partition import measured_partition
    corpus = Path(__file__).parent / "corpus" / name
    data = np.load(corpus / "inputs.npz")
    config = {"target": "cuda -arch=sm_90", "backends": ["cutlass", "cublaslt", "builtin"], "precision": "float16"}
    mod = pipeline.lower(corpus / "torchscript.onnx", config, until="pin_devices",
                         input_shapes={k: data[k].shape for k in data})
    cutlass = Target("cutlass", sm=90)
    cutlass.device = Target("cuda -arch=sm_90")
    mod = lower_split(get_backend("cutlass").pre_partition(mod, cutlass, "cuda"))
    forced = measured_partition(mod, ["cutlass", "cublaslt"], lambda m, requests: [None] * len(requests),
                                PartitionReport())
    priority = fuse_ops_by_pattern(mod, ["cutlass", "cublaslt"], PartitionReport())
    assert forced is not None and forced.script(elide_data_over=16) == priority.script(elide_data_over=16)


def test_a_shared_store_of_odd_entries_is_shown_and_merged_without_a_crash(cache, tmp_path, capsys):
    from byoc.cli import main
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"format": "byoc-costs", "version": 1, "entries": {
        "cpu:a": {"k1": "not an entry", "k2": {"us": "fast", "backend": 3, "ops": None},
                  "k3": {"us": 1.5, "backend": "builtin", "ops": "add\u001b[2J"}},
        "cpu:b": ["not", "a", "table"]}}))
    assert main(["tuning", "show", str(odd)]) == 0
    shown = capsys.readouterr().out
    assert "- us" in shown and "1.50 us" in shown and "\x1b" not in shown  # escape sequences escaped
    assert main(["tuning", "merge", str(odd)]) == 0
    merged = CostStore(cache / "costs" / "costs.json")
    assert merged.lookup("cpu:a", "k3") == 1.5 and merged.lookup("cpu:a", "k2") is None
    assert merged.lookup("cpu:a", "k1") is None


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("gpu_probe").gpu_present(), reason="no GPU visible")
def test_a_measured_cuda_build_times_its_candidates_on_the_gpu(cache, tmp_path):
    """On the GPU: CUTLASS, cuBLASLt and the built-in backend's candidates for BERT's ops
    are timed on the device of the target's arch, the store keys them by that GPU, the
    cheapest cover runs right and a second build measures nothing."""
    import cupy
    data = np.load(FIXTURES / "bert2.npz")
    inputs = {k[3:]: data[k] for k in data if k.startswith("in_")}
    want = next(data[k] for k in data if k.startswith("out_"))
    config = {"target": "cuda -arch=sm_90", "backends": [{"cutlass": {"sm": 90}}, "cublaslt", "builtin"],
              "precision": "float16", "partition": "measured"}
    shapes = {name: value.shape for name, value in inputs.items()}
    library = byoc.build(FIXTURES / "bert2.onnx", config=config, workdir=str(tmp_path / "first"), input_shapes=shapes)
    measured = library.report.to_json()["measured"]
    assert measured["decisions"] and measured["cost_us"] > 0
    assert not any("priority order" in note for note in measured["notes"]), measured["notes"]
    store = json.loads((cache / "costs" / "costs.json").read_text())
    device = device_fingerprint(Target("cuda -arch=sm_90"))
    assert device.startswith("cuda:") and device.endswith("sm_90"), device
    entries = store["entries"][device]
    assert {e["backend"] for e in entries.values()} >= {"cutlass", "builtin"}
    assert all(e["us"] > 0 for e in entries.values() if "us" in e)
    got = library.load().run(**{k: cupy.asarray(v) for k, v in inputs.items()})
    got = cupy.asnumpy(got[0] if isinstance(got, tuple) else got)
    assert np.max(np.abs(got.astype(np.float32) - want)) <= 2e-2 * max(1.0, float(np.max(np.abs(want))))
    again = byoc.build(FIXTURES / "bert2.onnx", config=config, workdir=str(tmp_path / "second"), input_shapes=shapes)
    assert again.report.to_json()["measured"]["cost_us"] == measured["cost_us"]
    assert json.loads((cache / "costs" / "costs.json").read_text()) == store


def test_candidates_are_built_side_by_side_and_timed_one_at_a_time(cache, tmp_path, monkeypatch):
    """With four compile jobs, two candidate builds run at once (threads), while timing
    (DEVICE_TIMING) is never entered by two; the choice is the one-at-a-time build's."""
    import threading
    from byoc import costs
    assert costs.candidate_build_slots(40, 32) == (16, 2) and costs.candidate_build_slots(3, None)[0] >= 1
    assert costs.candidate_build_slots(1, 8) == (1, 8)
    real_build, real_time = costs.build_candidate, costs.time_candidate
    lock, building, most, timing = threading.Lock(), [0], [0], []

    def build(*args):
        with lock:
            building[0] += 1
            most[0] = max(most[0], building[0])
        try:
            return real_build(*args)
        finally:
            with lock:
                building[0] -= 1

    def time(*args):
        assert costs.DEVICE_TIMING.acquire(blocking=False)  # nothing else times now
        costs.DEVICE_TIMING.release()
        timing.append(building[0])
        return real_time(*args)
    monkeypatch.setattr(costs, "build_candidate", build)
    monkeypatch.setattr(costs, "time_candidate", time)
    library = byoc.build(FIXTURES / "mlp.onnx", config={**MEASURED, "compile_jobs": 4}, workdir=str(tmp_path / "m"))
    assert most[0] == 2 and timing and not any(timing)  # every build done before the first timing
    inputs, want = mlp_case()
    assert np.max(np.abs(library.load().run(**inputs) - want)) <= 1e-4 * np.max(np.abs(want))
    assert len(library.report.to_json()["measured"]["decisions"]) == 3


def test_a_candidates_copies_take_the_operand_sets_in_turn():
    """32 copies of a candidate of two inputs over 3 operand sets: copies 0-2 get arrays of
    their own, every later copy those of copy (its number % 3), the same objects."""
    from byoc.costs import candidate_inputs
    tensors = [{"shape": [4, 8], "dtype": "float32"}, {"shape": [8], "dtype": "float16"}] * 32
    arrays = candidate_inputs(tensors, 32, 3, cuda=False)
    assert len(arrays) == 64 and len({id(a) for a in arrays}) == 6
    for copy in range(32):
        assert arrays[2 * copy] is arrays[2 * (copy % 3)] and arrays[2 * copy + 1] is arrays[2 * (copy % 3) + 1]
    assert arrays[0].shape == (4, 8) and arrays[1].dtype == np.float16
    assert len({id(a) for a in candidate_inputs(tensors[:6], 3, 3, cuda=False)}) == 6


def test_a_cutlass_candidate_the_tuning_database_knows_costs_its_time_there_unbuilt(tmp_path, monkeypatch):
    """A CUTLASS candidate whose GEMMs the tuning database timed on this GPU's model costs
    the sum of their times without a build; one timed on another GPU, one with an op the
    backend leaves to another, and any without a GPU are built and timed (None here)."""
    import importlib
    import types
    from byoc.backends.cutlass.kernels import default_kernel, kernel_problem
    from byoc.backends.cutlass.tuning import TuningDatabase
    from byoc.config import load_config
    from byoc.costs import known_cost
    from byoc.ir.expr import Function
    import byoc.target as target_module
    cutlass_codegen = importlib.import_module("byoc.backends.cutlass.codegen")
    monkeypatch.setattr(target_module, "visible_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    database_path = tmp_path / "db.json"
    config = load_config({"target": "cuda -arch=sm_90", "backends": [{"cutlass": {"sm": 90, "tuning_db":
                          str(database_path), "shipped_tuning": False}}], "precision": "float16"})
    context = types.SimpleNamespace(config=config, target=Target("cuda -arch=sm_90"), backend_targets={})
    for name, options in config.backends:
        context.backend_targets[name] = Target(name, **options)
        context.backend_targets[name].device, context.backend_targets[name].workdir = context.target, tmp_path
    target = context.backend_targets["cutlass"]

    def cutlass_functions(module_or_path, workdir):
        partitioned = pipeline.lower(module_or_path, config, until="partition", workdir=workdir)
        return {name: f for name, f in partitioned.functions.items()
                if isinstance(f, Function) and f.attrs.get("Compiler") == "cutlass"}
    functions = cutlass_functions(FIXTURES / "mlp.onnx", tmp_path / "p")
    # one dense layer (matmul, add, gelu) as the measured partition cuts it out of main
    main = pipeline.lower(FIXTURES / "mlp.onnx", config, until="pin_devices", workdir=tmp_path / "s")["main"]
    layer, _ = candidate_module(main, frozenset([1, 2, 3]))
    layer_function, = cutlass_functions(layer, tmp_path / "l").values()
    assert len(functions) == 3
    database, us = TuningDatabase(database_path), {}
    problems = {name: kernel_problem(90, cutlass_codegen.partition_problem(f)[0]) for name, f in functions.items()}
    layer_problem = kernel_problem(90, cutlass_codegen.partition_problem(layer_function)[0])
    elsewhere = next(name for name, problem in problems.items() if problem != layer_problem)
    for number, (name, problem) in enumerate(problems.items()):
        us[name] = 10.0 + number
        database.record(90, problem, default_kernel(90, problem), us[name], {},
                        {"device": "NVIDIA H200" if name == elsewhere else "NVIDIA H100 80GB HBM3"})
    database.save()
    here = {name: f for name, f in functions.items() if name != elsewhere}
    assert cutlass_codegen.known_cost(here, target) == pytest.approx(sum(us[name] for name in here))
    assert cutlass_codegen.known_cost({elsewhere: functions[elsewhere]}, target) is None  # an H200's time
    assert known_cost(layer, "cutlass", context) == pytest.approx(
        next(us[name] for name, problem in problems.items() if problem == layer_problem))  # unbuilt
    whole, _ = candidate_module(main, frozenset(range(len(main.bindings))))
    assert known_cost(whole, "cutlass", context) is None  # its casts go to the built-in backend
    assert known_cost(layer, "builtin", context) is None
    monkeypatch.setattr(target_module, "visible_gpu_name", lambda: None)
    assert cutlass_codegen.known_cost(here, target) is None  # no GPU: nothing is this GPU's
