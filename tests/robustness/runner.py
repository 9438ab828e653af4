"""Runs robustness cases, each in its own forked child, and classifies what happened.

A crash (a signal) or a hang must be seen, not suffered, so no case runs in the pytest
process. Spawning a fresh Python per case would cost ~1 s of imports each; instead a
*fork server* -- a fresh Python process started once per session, `ForkServer` below --
imports byoc, NumPy, onnx and onnxruntime once, then forks one child per case:

    pytest --(pickled cases)--> fork server --fork--> child: runs the case, writes one
    pytest <--(results, streamed)-- server <--(pipe)--  pickled record to a pipe, _exit()s

The server waits for each child with the case's timeout (killing it on a hang) and runs
up to `jobs` children at a time. Being a fresh process, it has no threads, no CUDA
context and no loaded model libraries that a fork could inherit half-initialized
(pytest may have initialized CUDA for other tests); each child creates its own.

A case is data (`Case`): a function named "module:function", its keyword arguments, a
timeout, what the spec expects (`expect="refuse"` when the input is forbidden, so that
accepting it is `wrong`) and the names an error message must mention. The child calls
the function; what it returns or raises gives the outcome:

    clear_error  a byoc.ByocError (any subclass) with a message naming the thing at fault
    correct      accepted, and the answer matched the reference (the function returns None
                 or Outcome("correct")) -- or the function checked the behaviour it expects
    crash        the child died by a signal, or exited without a record
    hang         the child ran past the case's timeout (killed)
    wrong        the function returned Outcome("wrong", why): an answer that differs from
                 the reference, a leak, or a forbidden input accepted
    raw          any exception that is not a ByocError (KeyError, TypeError, ...)
    vague        a ByocError whose message names none of `Case.names`
and three informational outcomes that do not fail a test: `accepted_ort_refused` (byoc
accepted and ran a model that onnxruntime refuses), `accepted_not_run` (accepted, too
large to run here) and `memory_limit` (the child hit this suite's address-space limit).
"""
from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS_DIR.parent

FAILING = ("crash", "hang", "wrong", "raw", "vague")
PASSING = ("clear_error", "correct")
INFORMATIONAL = ("accepted_ort_refused", "accepted_not_run", "memory_limit")
OUTCOMES = PASSING + FAILING + INFORMATIONAL

# Children get this address-space limit (so that a model asking for a huge tensor fails
# with MemoryError instead of taking the machine down); cuda cases set none (the driver
# reserves large virtual ranges).
DEFAULT_MEMORY_LIMIT = 8 << 30
MESSAGE_LIMIT = 1500       # characters of a message kept in a result
CAPTURE_TAIL = 2500        # bytes of a child's stdout/stderr kept for crash reports


@dataclass
class Case:
    family: str                 # model, api, library, concurrency, soak
    group: str                  # the kind of mutation or misuse, e.g. "attribute/out_of_domain"
    name: str                   # unique within the family, says what the case does
    function: str               # "robustness.cases_model:run_model" -- called in the child
    params: dict = field(default_factory=dict)
    timeout: float = 30.0
    expect: str = "any"         # "refuse": the spec forbids this input; accepting it is wrong;
                                # "accept": a positive control, a valid input of the same generator
                                # that must run and match (a refusal of it is wrong: "refuse
                                # everything" must fail the suite)
    why: str = ""               # for expect="refuse": what the spec forbids
    names: tuple = ()           # a refusal's message must contain one of these (empty: no check)
    memory_limit: int | None = DEFAULT_MEMORY_LIMIT
    exclusive: bool = False     # runs alone (a soak measuring memory: no other child beside it)

    @property
    def id(self) -> str:
        return f"{self.family}/{self.group}/{self.name}"


@dataclass
class Outcome:
    """What a case function returns when it does not simply succeed."""
    kind: str
    message: str = ""


@dataclass
class Result:
    case: Case
    outcome: str
    message: str = ""
    detail: str = ""            # traceback of a raw error, captured output of a crash
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.outcome in FAILING


# ---------------------------------------------------------------------------------
# In the child
# ---------------------------------------------------------------------------------

def _resolve(function: str):
    module, _, name = function.partition(":")
    return getattr(importlib.import_module(module), name)


def _short(text: str) -> str:
    text = str(text)
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + " [...]"


def execute(case: Case) -> dict:
    """Run one case in this process and classify it (crash and hang are the parent's)."""
    result = _execute(case)
    if case.expect == "accept" and result["outcome"] != "correct":
        return {"outcome": "wrong", "message": _short(f"a valid input (a positive control) was not accepted and "
                                                      f"matched: {result['outcome']}: {result['message']}"),
                "detail": result["detail"]}
    return result


def _execute(case: Case) -> dict:
    from byoc.errors import ByocError
    detail = ""
    try:
        returned = _resolve(case.function)(**case.params)
    except ByocError as error:
        message = str(error)
        if not message.strip():
            kind, message = "raw", f"{type(error).__name__} with an empty message"
        elif case.names and not any(name in message for name in case.names):
            kind = "vague"
            message = f"{type(error).__name__}: {message}  [names none of {list(case.names)}]"
        else:
            kind, message = "clear_error", f"{type(error).__name__}: {message}"
        detail = "".join(traceback.format_exception(error)[-4:])
        return {"outcome": kind, "message": _short(message), "detail": _short(detail)}
    except MemoryError as error:
        return {"outcome": "memory_limit", "message": _short(f"MemoryError: {error}"),
                "detail": _short("".join(traceback.format_exception(error)[-4:]))}
    except BaseException as error:  # noqa: BLE001 - every other exception is the finding
        return {"outcome": "raw", "message": _short(f"{type(error).__name__}: {error}"),
                "detail": _short("".join(traceback.format_exception(error)[-6:]))}
    outcome = returned if isinstance(returned, Outcome) else Outcome("correct")
    if case.expect == "refuse" and outcome.kind in ("correct", "accepted_ort_refused", "accepted_not_run"):
        outcome = Outcome("wrong", f"accepted what the spec forbids ({case.why}); it then "
                                   f"{'ran' if outcome.kind != 'accepted_not_run' else 'imported'}"
                                   f"{': ' + outcome.message if outcome.message else ''}")
    return {"outcome": outcome.kind, "message": _short(outcome.message), "detail": detail}


def _child_main(case: Case, write_fd: int, capture_path: str, workdir: str, close_fds: list[int]):
    """The forked child: never returns (os._exit), whatever happens."""
    status = 0
    try:
        for fd in close_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        capture = os.open(capture_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(capture, 1)
        os.dup2(capture, 2)
        os.close(capture)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        faulthandler.enable(file=sys.stderr, all_threads=True)  # a crash report names the frame
        # and so does a hang: the stacks are written shortly before the parent kills the child
        faulthandler.dump_traceback_later(max(1.0, case.timeout - 2.0), file=sys.stderr)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(workdir)
        os.environ["BYOC_ROBUSTNESS_CASE_DIR"] = workdir
        if case.memory_limit:
            resource.setrlimit(resource.RLIMIT_AS, (case.memory_limit, case.memory_limit))
        record = execute(case)
        data = pickle.dumps(record)
        view = memoryview(data)
        while view:
            written = os.write(write_fd, view)
            view = view[written:]
    except BaseException:  # noqa: BLE001 - the parent reports a child without a record
        status = 3
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(status)


def case_dir() -> Path:
    """The child's private temporary folder (its working directory; removed afterwards)."""
    return Path(os.environ.get("BYOC_ROBUSTNESS_CASE_DIR", tempfile.gettempdir()))


# ---------------------------------------------------------------------------------
# In the fork server
# ---------------------------------------------------------------------------------

@dataclass
class _Running:
    index: int
    case: Case
    pid: int
    read_fd: int
    started: float
    capture_path: str
    workdir: str
    chunks: list = field(default_factory=list)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - CAPTURE_TAIL))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _crash_frame(captured: str) -> str:
    """The innermost Python frame faulthandler printed for the crashing thread."""
    lines = [line.strip() for line in captured.splitlines()]
    for start, line in enumerate(lines):
        if line.startswith(("Current thread", "Thread 0x")) and "most recent call first" in line:
            for frame in lines[start + 1:]:
                if frame.startswith("File "):
                    return frame
    return ""


def _finish(running: _Running, status: int | None, timed_out: bool) -> Result:
    seconds = time.monotonic() - running.started
    captured = _tail(running.capture_path)
    if timed_out:
        frame = _crash_frame(captured)
        return Result(running.case, "hang", f"no result after {running.case.timeout:.0f} s (killed)"
                      + (f", waiting at {frame}" if frame else ""), captured, seconds)
    if os.WIFSIGNALED(status):
        frame = _crash_frame(captured)
        message = f"killed by {_signal_name(os.WTERMSIG(status))}" + (f" at {frame}" if frame else "")
        return Result(running.case, "crash", message, captured, seconds)
    data = b"".join(running.chunks)
    if not data:
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
        return Result(running.case, "crash", f"exited with status {code} without a result record", captured,
                      seconds)
    try:
        record = pickle.loads(data)
    except Exception as error:  # noqa: BLE001
        return Result(running.case, "crash", f"unreadable result record ({error})", captured, seconds)
    detail = record.get("detail", "")
    if record["outcome"] in FAILING and captured.strip():
        detail = f"{detail}\n--- child output ---\n{captured}"
    return Result(running.case, record["outcome"], record.get("message", ""), detail, seconds)


def _start(index: int, case: Case, scratch: str, keep_fds: list[int]) -> _Running:
    read_fd, write_fd = os.pipe()
    workdir = tempfile.mkdtemp(prefix=f"case{index}-", dir=scratch)
    capture_path = os.path.join(scratch, f"case{index}.out")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child_main(case, write_fd, capture_path, workdir, [read_fd] + keep_fds)
    os.close(write_fd)
    return _Running(index, case, pid, read_fd, time.monotonic(), capture_path, workdir)


def run_cases_here(cases: list[Case], jobs: int, on_result, protocol_fds: list[int]):
    """Fork a child per case, at most `jobs` at a time; call on_result(index, Result)."""
    scratch = tempfile.mkdtemp(prefix="byoc-robustness-")
    pending = deque(enumerate(cases))
    running: dict[int, _Running] = {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                if running and (pending[0][1].exclusive or any(r.case.exclusive for r in running.values())):
                    break
                index, case = pending.popleft()
                # a child closes the protocol pipes and the read ends of its siblings' pipes
                child = _start(index, case, scratch, protocol_fds + list(running))
                running[child.read_fd] = child
            now = time.monotonic()
            wait = max(0.0, min(r.started + r.case.timeout for r in running.values()) - now)
            readable, _, _ = select.select(list(running), [], [], min(wait, 1.0))
            for fd in readable:
                child = running[fd]
                data = os.read(fd, 1 << 16)
                if data:
                    child.chunks.append(data)
                    continue
                # EOF: the child exited (or closed the pipe); reap it within its deadline
                del running[fd]
                os.close(fd)
                on_result(child.index, _reap(child))
            now = time.monotonic()
            for fd, child in list(running.items()):
                if now > child.started + child.case.timeout:
                    del running[fd]
                    os.close(fd)
                    _kill(child.pid)
                    on_result(child.index, _finish(child, None, timed_out=True))
                    _cleanup(child)
    finally:
        for fd, child in running.items():
            _kill(child.pid)
            os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)


def _reap(child: _Running) -> Result:
    deadline = child.started + child.case.timeout
    while True:
        pid, status = os.waitpid(child.pid, os.WNOHANG)
        if pid:
            result = _finish(child, status, timed_out=False)
            break
        if time.monotonic() > deadline:
            _kill(child.pid)
            result = _finish(child, None, timed_out=True)
            break
        time.sleep(0.002)
    _cleanup(child)
    return result


def _kill(pid: int):
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _cleanup(child: _Running):
    shutil.rmtree(child.workdir, ignore_errors=True)
    try:
        os.unlink(child.capture_path)
    except OSError:
        pass


def _send(stream, message):
    data = pickle.dumps(message)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


PRELOAD = ("numpy", "onnx", "onnx.helper", "onnx.numpy_helper", "onnxruntime", "byoc", "byoc.runtime",
           "byoc.frontend.onnx", "ml_dtypes")


def serve():
    """The fork server's main loop (run by ForkServer in a fresh interpreter)."""
    # The protocol owns the original stdin/stdout; anything else printing to fd 1 (a
    # library, a warning) must not corrupt it, so fd 1 becomes stderr.
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    protocol_fds = [requests.fileno(), replies.fileno()]
    for module in PRELOAD:
        importlib.import_module(module)
    _send(replies, ("ready", os.getpid()))
    while True:
        request = _receive(requests)
        if request is None or request[0] == "stop":
            return
        _, cases, jobs = request
        for module in sorted({case.function.partition(":")[0] for case in cases}):
            importlib.import_module(module)  # once here, not in every child
        run_cases_here(cases, jobs, lambda index, result: _send(replies, ("result", index, result)), protocol_fds)
        _send(replies, ("done",))


BOOT = ("import sys; sys.path[:0] = [{tests!r}, {root!r}]; "
        "from robustness.runner import serve; serve()")


def everything() -> bool:
    """BYOC_ROBUSTNESS_ALL=1: every case, not the default seeded sample."""
    return os.environ.get("BYOC_ROBUSTNESS_ALL", "") not in ("", "0")


class ForkServer:
    """The client side, in the pytest process: starts the server, sends it cases."""

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs or int(os.environ.get("BYOC_ROBUSTNESS_JOBS", 0)) or os.cpu_count() or 1
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        self.process = subprocess.Popen(
            [sys.executable, "-c", BOOT.format(tests=str(TESTS_DIR), root=str(REPO_ROOT))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(REPO_ROOT), env=env)
        hello = _receive(self.process.stdout)
        if not hello or hello[0] != "ready":
            self.close()
            raise OSError("the robustness fork server did not start (see its stderr above)")

    def run(self, cases: list[Case]) -> list[Result]:
        if not cases:
            return []
        _send(self.process.stdin, ("run", cases, self.jobs))
        results: list[Result | None] = [None] * len(cases)
        while True:
            message = _receive(self.process.stdout)
            if message is None:
                raise OSError("the robustness fork server died (see its stderr above)")
            if message[0] == "done":
                return results
            _, index, result = message
            results[index] = result

    def close(self):
        if self.process.poll() is None:
            try:
                _send(self.process.stdin, ("stop",))
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.process.kill()
                self.process.wait()
