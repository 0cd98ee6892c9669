"""engine/limits.py: a bounded call runs in a worker process and comes back with its result or its
error; past the limit, or when the caller's poll raises (the app's Cancel), the worker's whole process
group is killed; engine/flags.py:time_limit_s reads --time-limit / TILEWEAVE_TIME_LIMIT."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from engine.errors import BackendError, TileweaveError, TimeLimitError
from engine.flags import time_limit_s
from engine.limits import WorkerTimeout, call_bounded, run_worker


def gone(pid: int, wait_s: float = 10.0) -> bool:
    """Whether process `pid` has exited (killed processes may take a moment to be reaped)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":  # a zombie has exited already
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def grandchild_script(pidfile) -> list[str]:
    """A worker that starts a long child of its own (as the C compiler starts cc1) and waits on it."""
    return ["sh", "-c", f"sleep 600 & echo $! > {pidfile}; wait"]


def test_a_bounded_call_runs_in_a_worker_and_returns_its_result():
    x = np.random.default_rng(7).standard_normal((64, 33)).astype(np.float32)
    assert np.array_equal(call_bounded(np.sort, x, axis=0, seconds=120, what="a sort"), np.sort(x, axis=0))
    assert call_bounded(os.getpid, seconds=120, what="getpid") != os.getpid()
    assert call_bounded(os.getpid, seconds=None, what="getpid") == os.getpid()  # no limit: in this process


def test_an_error_in_the_worker_is_raised_here_as_it_was():
    with pytest.raises(TileweaveError, match="'abc' is not a time limit in seconds"):
        call_bounded(time_limit_s, "abc", seconds=120, what="parsing")


def test_a_worker_that_dies_is_one_line():
    with pytest.raises(BackendError, match=r"the crash died \(signal SIGABRT\)"):
        call_bounded(os.abort, seconds=120, what="the crash")


def test_past_its_limit_a_call_is_stopped_with_a_line_naming_it_the_limit_and_the_flag():
    with pytest.raises(TimeLimitError) as err:
        call_bounded(time.sleep, 600, seconds=0.5, what="the nap")
    assert str(err.value) == ("the nap did not finish within the 0.5 s time limit "
                              "(raise it with --time-limit SECONDS or TILEWEAVE_TIME_LIMIT)")
    assert call_bounded(time.sleep, 0.01, seconds=120, what="a short nap") is None  # a generous limit: done


def test_a_timeout_kills_the_workers_children_too(tmp_path):
    pidfile = tmp_path / "child.pid"
    with pytest.raises(WorkerTimeout):
        run_worker(grandchild_script(pidfile), timeout=2.0)
    assert gone(int(pidfile.read_text()))


class Cancel(BaseException):
    """Stands for Streamlit's rerun signal (a BaseException raised at the page's next write)."""


def test_a_poll_that_raises_cancels_the_worker_and_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    polls = []

    def poll(elapsed: float) -> None:
        polls.append(elapsed)
        if pidfile.exists() and pidfile.read_text().strip():
            raise Cancel

    with pytest.raises(Cancel):
        run_worker(grandchild_script(pidfile), timeout=None, poll=poll)
    assert polls == sorted(polls) and polls[-1] > 0
    assert gone(int(pidfile.read_text()))


def test_a_worker_that_finishes_returns_its_output():
    code, out, err = run_worker([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
                                timeout=120, poll=lambda elapsed: None)
    assert (code, out, err) == (0, "out\n", "err\n")


def test_time_limit_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.delenv("TILEWEAVE_TIME_LIMIT", raising=False)
    assert time_limit_s(None) is None
    assert time_limit_s("2.5") == 2.5
    monkeypatch.setenv("TILEWEAVE_TIME_LIMIT", "30")
    assert time_limit_s(None) == 30.0 and time_limit_s("7") == 7.0
    for bad in ("0", "-3", "nan", "inf", "soon"):
        with pytest.raises(TileweaveError, match=f"--time-limit '{bad}' is not a time limit"):
            time_limit_s(bad)
    monkeypatch.setenv("TILEWEAVE_TIME_LIMIT", "-1")
    with pytest.raises(TileweaveError, match="TILEWEAVE_TIME_LIMIT '-1' is not a time limit"):
        time_limit_s(None)


def test_export_bounds_nvrtc_by_the_time_limit(tmp_path, capsys):
    """`tileweave export --time-limit`: NVRTC runs in-process, so a bounded export compiles in a worker;
    past the limit the export stops with one line naming the NVRTC compile (exit 2) and writes nothing."""
    from pathlib import Path

    from engine.cli import main

    model = Path(__file__).resolve().parents[2] / "samples" / "conv_bn_relu.onnx"
    out = tmp_path / "bundle.zip"
    code = main(["export", str(model), "--policy", "welder", "--time-limit", "0.05", "-o", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "NVRTC compile" in err and "0.05 s time limit" in err and "--time-limit" in err
    assert not out.exists()
