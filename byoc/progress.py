"""What a build is doing, as it does it (build.py reports its steps through BuildProgress)."""
from __future__ import annotations

import contextlib
import logging
import re
import time


class BuildProgress:
    """What a build is doing, as it does it: INFO records on the `byoc.build` logger (the
    CLI prints them to stderr; a Python caller sees them by configuring logging), each with
    the seconds since the step began. Within heartbeat(), a step that is silent for
    HEARTBEAT_S (one long nvcc compile, a tuning run) is reported as still going."""

    HEARTBEAT_S = 5.0

    def __init__(self):
        self.logger = logging.getLogger("byoc.build")
        self.started = time.perf_counter()
        self.last_time, self.last_what = self.started, "starting"

    def _log(self, what: str):
        self.last_time = time.perf_counter()
        self.logger.info("[%6.1f s] %s", self.last_time - self.started, what)

    def stage(self, what: str):
        self.last_what = what
        self._log(what)

    def compile_line(self, line: str):
        # ninja's status lines, "[3/12] compile cutlass_1f2e.cu" (the edge's description),
        # come as each edge finishes: a heartbeat after one names what is still compiling
        # by count, not the unit that just finished
        status = re.match(r"\[(\d+)/(\d+)\] (.*)", line)
        self.last_what = (f"compiling, {status.group(1)} of {status.group(2)} units done (the last: "
                          f"{status.group(3)})") if status else line
        self._log(line)

    @contextlib.contextmanager
    def heartbeat(self):
        import threading
        done = threading.Event()

        def beat():
            while not done.wait(0.5):
                silent = time.perf_counter() - self.last_time
                if silent >= self.HEARTBEAT_S - 0.5:
                    self._log(f"... still working, {silent:.0f} s after: {self.last_what}")
        thread = threading.Thread(target=beat, name="byoc-build-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
