"""A plan made beside the caller's work in a forked child process, on a machine with a core to spare.

The welder policy holds its walk's plan against the stitch policy's (`welder.at_least_stitch`), and the
stitch plan does not depend on the walk: on a host of several cores a child forked before the walk plans it
while the walk runs (1.1 s of zoo mobilevit's 7.3 s cold plan on host, 0.9 of vit's 3.2; benchmarks/NOTES.md
forkstitch). Planning is a pure function of the graph, the device and the options, so the child's plan is the
one the caller would make; the caller takes it through a pipe, with the tile searches the child added to the
schedule tables (`schedcache.TABLES`: kept on disk after the plan, as an in-process plan would leave them).

A child is forked only where that is safe and useful: a POSIX `os.fork`, one Python thread in the process (a
fork copies no other thread: the workbench, Ray and test runners hold several, and plan in-process), two or
more cores this process may run on, and TILEWEAVE_PLAN_FORK not off. Anything that goes wrong in the child —
an exception, a result that does not come back — makes the caller plan in-process as before: the fork can make
planning faster, never make it fail or differ."""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from engine.errors import TileweaveError
from engine.flags import debug
from engine.memo import memo

MIN_STAGES = 40  # graphs smaller than this plan in well under a fork's cost of waiting (tens of ms)


def fork_enabled() -> bool:
    """TILEWEAVE_PLAN_FORK: on (the default) or off; anything else is a one-line error."""
    raw = os.environ.get("TILEWEAVE_PLAN_FORK", "").strip().lower()
    if raw in ("", "on", "1"):
        return True
    if raw in ("off", "0"):
        return False
    raise TileweaveError(f"TILEWEAVE_PLAN_FORK={raw!r} is not on or off",
                         hint="use on or off (off: the welder policy plans the stitch plan it is held against "
                              "after its walk, in-process), or unset it")


def can_fork() -> bool:
    """Whether a child may be forked now: enabled, POSIX, one Python thread, two or more usable cores."""
    if not fork_enabled() or not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cores >= 2


class Forked:
    """`fn()` running in a forked child: `result()` waits for its value (None where the child failed: the
    caller computes it itself), `cancel()` ends the child unheard. `tables`: memo table name -> its limit, whose
    entries the child adds come back with the value."""

    def __init__(self, fn: Callable[[], Any], tables: Mapping[str, int] | None = None):
        tables = dict(tables or {})
        self.tables = tables
        self._read, write = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # the child: compute, send, leave without running the parent's exit handlers
            os.close(self._read)
            try:
                known = {name: {k for k, _ in memo(name, limit).items()} for name, limit in tables.items()}
                value = fn()
                added = {name: [(k, v) for k, v in memo(name, limit).items() if k not in known[name]]
                         for name, limit in tables.items()}
                data = pickle.dumps(("ok", value, added), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:  # noqa: BLE001 -- any failure: the caller plans in-process
                data = pickle.dumps(("error", f"{type(exc).__name__}: {exc}", {}))
            try:
                with os.fdopen(write, "wb") as out:
                    out.write(data)
            finally:
                os._exit(0)
        os.close(write)

    def result(self) -> Any | None:
        """The child's value (its search tables' new entries merged into the caller's), or None."""
        try:
            with os.fdopen(self._read, "rb") as src:
                data = src.read()
        finally:
            os.waitpid(self._pid, 0)
        try:
            status, value, added = pickle.loads(data)
        except Exception as exc:  # noqa: BLE001 -- an empty or cut pipe: the child died
            debug(1, f"forked plan: no result from the child ({type(exc).__name__}); planning in-process")
            return None
        if status != "ok":
            debug(1, f"forked plan: the child failed ({value}); planning in-process")
            return None
        for name, entries in added.items():
            table = memo(name, self.tables[name])
            for k, v in entries:
                if not table.has(k):
                    table.put(k, v)
        return value

    def cancel(self) -> None:
        """End the child (its value is not wanted)."""
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self._read)
        os.waitpid(self._pid, 0)
