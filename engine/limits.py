"""Time budgets: a function call in, its result out, or a one-line TimeLimitError when it outlives its
budget. A bounded call runs in a worker process of its own session (`python -m engine.limits`),
so running out of time kills the worker and everything it started (a compiler, a runaway kernel) and
leaves this process as it was; the budget comes from `--time-limit` or TILEWEAVE_TIME_LIMIT."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import BackendError, TimeLimitError
from engine.files import write_atomic

FLAG = "--time-limit"
RAISE_IT = f"raise it with {FLAG} SECONDS or TILEWEAVE_TIME_LIMIT"
_POLL_S = 0.2


class WorkerTimeout(Exception):
    """A worker outlived its timeout and was killed; `out`/`err` hold what it had printed."""

    def __init__(self, out: str, err: str):
        super().__init__("worker timed out")
        self.out, self.err = out, err


def worker_env() -> dict[str, str]:
    """This environment with the repository root on PYTHONPATH, so `python -m engine...` finds it."""
    root = str(Path(__file__).resolve().parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))


def run_worker(argv: list[str], *, timeout: float | None, env: dict[str, str] | None = None,
               poll: Callable[[float], None] | None = None) -> tuple[int, str, str]:
    """Run `argv` in its own session; (returncode, stdout, stderr). Past `timeout` seconds the whole
    process group is killed (a compiler it started goes too) and WorkerTimeout is raised. `poll(elapsed)`
    is called every fraction of a second while it runs: whatever it raises (the app's rerun on Cancel)
    also kills the group before it propagates."""
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or worker_env(), start_new_session=True)
    try:
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise subprocess.TimeoutExpired(argv, timeout)
            wait = _POLL_S if poll else None
            if deadline is not None:
                wait = deadline - now if wait is None else min(wait, deadline - now)
            try:
                out, err = proc.communicate(timeout=wait)
                return proc.returncode, out, err
            except subprocess.TimeoutExpired:
                if poll:
                    poll(time.monotonic() - started)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise WorkerTimeout(out, err) from None
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone


def call_bounded(fn: Callable, *args, seconds: float | None, what: str,
                 poll: Callable[[float], None] | None = None, **kwargs):
    """`fn(*args, **kwargs)`, in a worker process when `seconds` is set (fn, its arguments and its result
    must pickle; fn must be a module-level function). A TileweaveError raised in the worker is raised
    here unchanged; past `seconds` the worker is killed and TimeLimitError names `what`, the limit and
    the flag. Without `seconds` (and without `poll`) fn runs here, unbounded."""
    if seconds is None and poll is None:
        return fn(*args, **kwargs)
    with tempfile.TemporaryDirectory(prefix="tw_bounded_") as folder:
        job, result = Path(folder) / "job.pkl", Path(folder) / "result.pkl"
        job.write_bytes(pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL))
        try:
            code, _, err = run_worker([sys.executable, "-m", "engine.limits", str(job), str(result)],
                                      timeout=seconds, poll=poll)
        except WorkerTimeout:
            raise TimeLimitError(f"{what} did not finish within the {seconds:g} s time limit",
                                 hint=RAISE_IT) from None
        if not result.exists():
            tail = (err.strip().splitlines() or [""])[-1][:200]
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            raise BackendError(f"{what} died ({how}){': ' + tail if tail else ''}")
        ok, value = pickle.loads(result.read_bytes())
    if ok:
        return value
    raise value


def _work(job: str, result: str) -> None:
    fn, args, kwargs = pickle.loads(Path(job).read_bytes())
    try:
        out = (True, fn(*args, **kwargs))
    except BaseException as err:  # noqa: BLE001 - carried to the parent and raised there
        try:
            pickle.dumps(err)
        except Exception:  # an exception that does not pickle: its traceback, as a plain error
            import traceback

            err = RuntimeError("".join(traceback.format_exception(err)))
        out = (False, err)
    write_atomic(result, pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))  # never half a result


if __name__ == "__main__":
    _work(sys.argv[1], sys.argv[2])
