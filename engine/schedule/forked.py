"""Planning work done beside the caller's in a forked child process, on a machine with a core to spare.

The welder walk runs on one core. Two things it needs do not depend on its decisions so far, and a child forked
before it does them on another core (`welder._beside`, benchmarks/NOTES.md forkstitch, forksplit):
- on a graph whose later half is mostly stages unlike the earlier half's, the tile searches of the later half:
  the child walks the graph from its middle edge (the edges before it apart) and sends the searches that made;
  the walk takes them when it reaches that edge — it waits for them there, so what it finds never depends on
  timing — and away from the split its groups are the child's, so their searches are hits (zoo swin 9.5 -> 5.4 s);
- the stitch plan the walk's is held against (`welder.at_least_stitch`), sent next.
Tile searches are pure functions of their keys and planning of the graph, the device and the options, so the
plan is the one the caller would make alone; the searches the child added come back with each message into the
caller's tables (`schedcache.TABLES`, kept on disk after the plan as an in-process plan leaves them).

A child is forked only where that is safe and useful: a POSIX `os.fork`, one Python thread in the process (a
fork copies no other thread: the workbench, Ray and test runners hold several, and plan in-process), two or
more cores this process may run on, and TILEWEAVE_PLAN_FORK not off. Anything that goes wrong in the child —
an exception, a message that does not come — makes the caller do that work itself: the fork can make planning
faster, never make it fail or differ."""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from engine.flags import debug, switch
from engine.memo import memo

MIN_STAGES = 40  # graphs smaller than this plan in well under a fork's cost of waiting (tens of ms)


def fork_enabled() -> bool:
    """TILEWEAVE_PLAN_FORK: on (the default) or off; anything else is a one-line error."""
    return switch("TILEWEAVE_PLAN_FORK", "the welder policy plans in-process only, no forked child beside its walk")


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
    """`fn(send)` running in a forked child, each `send(value)` a message: `result()` waits for the next one's
    value (None where the child failed or ended first: the caller computes it itself), `close()` ends the child
    (unheard, if it is still at work) and reaps it. `tables`: memo table name -> its limit; the entries the child
    adds to them come back with each message (those added since the one before)."""

    def __init__(self, fn: Callable[[Callable[[Any], None]], None], tables: Mapping[str, int] | None = None):
        self.tables = dict(tables or {})
        self._failed = False
        self._read, write = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # the child: compute, send, leave without running the parent's exit handlers
            os.close(self._read)
            try:
                with os.fdopen(write, "wb") as out:
                    known = {name: {k for k, _ in memo(name, limit).items()} for name, limit in self.tables.items()}

                    def send(value: Any) -> None:
                        added = {}
                        for name, limit in self.tables.items():
                            added[name] = [(k, v) for k, v in memo(name, limit).items() if k not in known[name]]
                            known[name].update(k for k, _ in added[name])
                        _write(out, ("ok", value, added))

                    try:
                        fn(send)
                    except BaseException as exc:  # noqa: BLE001 -- any failure: the caller plans in-process
                        _write(out, ("error", f"{type(exc).__name__}: {exc}", {}))
            finally:
                os._exit(0)
        os.close(write)
        self._src = os.fdopen(self._read, "rb")

    def result(self) -> Any | None:
        """The child's next message's value (its search tables' new entries merged into the caller's), or None."""
        if self._failed:
            return None
        try:
            head = self._src.read(8)
            status, value, added = pickle.loads(self._src.read(int.from_bytes(head, "little")))
        except Exception as exc:  # noqa: BLE001 -- an empty or cut pipe: the child died or ended
            debug(1, f"forked plan: no result from the child ({type(exc).__name__}); planning in-process")
            self._failed = True
            return None
        if status != "ok":
            debug(1, f"forked plan: the child failed ({value}); planning in-process")
            self._failed = True
            return None
        for name, entries in added.items():
            table = memo(name, self.tables[name])
            for k, v in entries:
                if not table.has(k):
                    table.put(k, v)
        return value

    def close(self) -> None:
        """End the child (nothing more of it is wanted) and reap it; again, nothing."""
        if self._src.closed:
            return
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._src.close()
        os.waitpid(self._pid, 0)


def _write(out, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(len(data).to_bytes(8, "little"))
    out.write(data)
    out.flush()
