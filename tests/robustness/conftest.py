"""Fixtures of the robustness suite: the fork server, the libraries built once per session,
and the report printed at the end of the run (also on success).

    BYOC_ROBUSTNESS_ALL=1          every case (default: a seeded sample, ~3 min on 2 cores)
    BYOC_ROBUSTNESS_JOBS=N         children at a time (default: the CPU count)
    BYOC_ROBUSTNESS_REPORT_DIR=D   also write every result to D/<family>.json
"""
from __future__ import annotations

import time

import pytest

from robustness import libraries, report
from robustness.runner import ForkServer

_REPORTS: list[str] = []


@pytest.fixture(scope="session")
def fork_server():
    server = ForkServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def cpu_libraries(tmp_path_factory):
    root = tmp_path_factory.mktemp("robustness_cpu")
    built = libraries.build_all(root, config="cpu", device="cpu", tolerance=1e-3)
    return built, libraries.build_fakes(root, built["mlp"]["metadata"])


@pytest.fixture(scope="session")
def run_family(fork_server):
    """run_family(title, cases) -> results; the report is kept for the end of the session
    and the JSON written when asked; fails the test on a crash/hang/wrong/raw/vague case."""
    def run(title: str, cases):
        started = time.monotonic()
        results = fork_server.run(cases)
        text = report.render(title, results, time.monotonic() - started)
        _REPORTS.append(text)
        path = report.report_path(title)
        if path is not None:
            report.write_json(path, results)
        failed = [r for r in results if r.failed]
        assert not failed, (f"{len(failed)} of {len(results)} {title} cases failed (the table of all outcomes "
                            f"is printed at the end of the run):\n{report.failures(results)}")
        return results
    return run


def pytest_terminal_summary(terminalreporter):
    if _REPORTS:
        terminalreporter.section("byoc robustness")
        for text in _REPORTS:
            terminalreporter.write_line(text)
            terminalreporter.write_line("")
