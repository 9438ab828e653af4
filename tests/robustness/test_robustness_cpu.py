"""The robustness suite on the CPU: at least 1,000 generated cases, each in a forked child;
none may crash, hang, answer wrong or raise anything but a byoc error that names what is
at fault. A failure prints a table of outcomes and the failing cases grouped by cause.

    pytest tests/robustness -m "not gpu"                        # the default sample
    BYOC_ROBUSTNESS_ALL=1 pytest tests/robustness -m "not gpu"  # every case
"""
from __future__ import annotations

from robustness import cases_api, cases_concurrency, cases_inputs, cases_library, cases_model
from robustness.runner import everything

MINIMUM_DEFAULT_CASES = 1000


def test_model_mutations(run_family):
    run_family("model mutations", cases_model.generate(everything()))


def test_api_misuse(run_family, cpu_libraries):
    built, _ = cpu_libraries
    run_family("api misuse (cpu)", cases_api.generate(built, device="cpu"))


def test_corrupted_libraries(run_family, cpu_libraries):
    built, fakes = cpu_libraries
    run_family("corrupted libraries (cpu)", cases_library.generate(built, fakes, everything()))


def test_concurrency_and_soak(run_family, cpu_libraries):
    built, _ = cpu_libraries
    run_family("concurrency and soak (cpu)", cases_concurrency.generate(built, everything(), device="cpu"))


def test_untrusted_inputs(run_family, cpu_libraries):
    built, _ = cpu_libraries
    run_family("untrusted inputs (cpu)", cases_inputs.generate(built["mlp"]["metadata"]))


def test_default_sample_has_at_least_1000_cases(cpu_libraries):
    built, fakes = cpu_libraries
    counts = {"model": len(cases_model.generate(False)), "api": len(cases_api.generate(built, device="cpu")),
              "library": len(cases_library.generate(built, fakes, False)),
              "concurrency/soak": len(cases_concurrency.generate(built, False, device="cpu")),
              "inputs": len(cases_inputs.generate(built["mlp"]["metadata"]))}
    assert sum(counts.values()) >= MINIMUM_DEFAULT_CASES, counts
