"""Planning work done beside the caller's in a forked child process, on a machine with a core to spare.

The welder walk runs on one core. Some of what it needs does not depend on its decisions so far, and a child
forked before it does that on another core (`welder._beside`, benchmarks/NOTES.md forkstitch, forksplit,
searchahead):
- on a graph whose later half is mostly stages unlike the earlier half's, the tile searches of the later half:
  the child walks the graph from its middle edge (the edges before it apart) and sends the searches that made;
  the walk takes them when it reaches that edge — it waits for them there, so what it finds never depends on
  timing — and away from the split its groups are the child's, so their searches are hits (zoo swin 9.5 -> 5.4 s);
  elsewhere the search of each stage alone, shared as it is made (the walk asks for every group apart);
- the stitch plan the walk's is held against (`welder.at_least_stitch`), sent next;
- between those steps, the walk's requests: the search of the edge it is at, at the level it tries second
  (`build.SearchAhead`), answered while it tries the first.
Tile searches are pure functions of their keys and planning of the graph, the device and the options, so the
plan is the one the caller would make alone; the searches the child added come back with its messages into the
caller's tables (`schedcache.TABLES`, kept on disk after the plan as an in-process plan leaves them) — at once
only those that answer every later search as the caller's own would (`Forked`'s `safe`).

A child is forked only where that is safe and useful: a POSIX `os.fork`, one Python thread in the process (a
fork copies no other thread: the workbench, Ray and test runners hold several, and plan in-process), two or
more cores this process may run on, and TILEWEAVE_PLAN_FORK not off. Anything that goes wrong in the child —
an exception, a message that does not come — makes the caller do that work itself: the fork can make planning
faster, never make it fail or differ."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from engine.flags import debug, switch
from engine.memo import Caches, memo

MIN_STAGES = 40  # graphs smaller than this plan in well under a fork's cost of waiting (tens of ms)
REQUEST_BYTES = 1 << 22  # the largest request (pickled) `Forked.ask` sends; larger ones are not asked


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
    """`fn(send)` running in a forked child, and requests answered by it between its steps.

    Messages: each `send(value)` in the child is one; `result()` waits for the next one's value (None where the
    child failed or ended first: the caller computes it itself). The entries the child added to `tables` (memo
    table name -> its limit) since the message before come with it and are merged when `result()` takes it, so
    the caller's tables change at the points it chooses. `send.share()` sends at once the entries added since
    that `safe(name, value)` allows: merged whenever the caller next reads from the child (entries that answer
    as the caller's own search would, whenever they arrive).

    Requests (`serve`: request -> value): `ask(rid, request)` sends one; the child answers the newest it has when
    it reaches `serve_point()` (the walk calls it before each edge, a tile search's pass before each candidate it
    costs; none inside a served request) or is done with `fn`, and only while the
    caller still wants it. `answer(rid)` gives the value where it came, waits where the child is at it, and
    otherwise gives None (the caller does it itself; the child will not start it). Served work runs with its
    own `SEPARATE` tables (the search answers; the pure tables below them are shared), so it never changes what
    `fn` computes or sends, and its answers bring back the entries of those tables `safe` allows.

    `close()` ends the child (unheard, if it is still at work) and reaps it."""

    def __init__(self, fn: Callable[[Any], None], tables: Mapping[str, int] | None = None,
                 serve: Callable[[Any], Any] | None = None, safe: Callable[[str, Any], bool] | None = None):
        import mmap

        self.tables = dict(tables or {})
        self._failed = False
        # Shared with the child: the rid wanted, the rid the child is at, the request slot's version (odd while
        # it is written) and length, whether the child answers now. The slot holds the newest request: a pipe
        # could fill while the child is busy and block the caller, and a request passed over is not wanted.
        self._flags = mmap.mmap(-1, 33)
        self._slot = mmap.mmap(-1, REQUEST_BYTES) if serve is not None else None
        self._flags[32] = serve is not None
        self._messages: list = []
        self._got: dict[int, tuple] = {}
        self._buffer = bytearray()
        self._res, res_write = os.pipe()
        bell, self._bell = os.pipe()  # a byte per request: wakes an idle child
        os.set_blocking(self._bell, False)
        self._pid = os.fork()
        if self._pid == 0:  # the child: compute, send, leave without running the parent's exit handlers
            os.close(self._res)
            os.close(self._bell)
            try:
                _Child(self, fn, serve, safe or (lambda name, value: False), bell, res_write).run()
            finally:
                os._exit(0)
        os.close(res_write)
        os.close(bell)

    def result(self) -> Any | None:
        """The child's next message's value (its tables' new entries merged into the caller's), or None."""
        while not self._messages and not self._failed:
            self._drain(block=True)
        if not self._messages:
            return None
        status, value, added = self._messages.pop(0)
        if status != "ok":
            debug(1, f"forked plan: the child failed ({value}); planning in-process")
            self._failed = True
            return None
        _merge(added, self.tables)
        return value

    def ask(self, rid: int, request: Any) -> None:
        """Send request `rid` (rids rise; it replaces any the child has not started), wanted from now on."""
        if self._failed or self._slot is None:
            return
        data = pickle.dumps((rid, request), protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > REQUEST_BYTES:
            return
        version = self._get(16) + 1
        self._set(16, version)  # odd: being written
        self._slot[:len(data)] = data
        self._set(24, len(data))
        self._set(16, version + 1)
        self._set(0, rid)
        try:
            os.write(self._bell, b"r")
        except BlockingIOError:
            pass  # the child has a full pipe of rings to read: it will look at the slot anyway
        except OSError:
            self._failed = True  # the child is gone

    def answer(self, rid: int, wait: bool = False) -> Any | None:
        """Request `rid`'s value where the child has it or is at it (waiting for it then), else None. `wait`:
        also where it has not started on it yet (it will, unless a later request or `drop` came first)."""
        self._drain(block=False)
        while rid not in self._got and not self._failed and (wait or self._get(8) == rid):
            self._drain(block=True)
        self._set(0, 0)  # wanted no more
        got = self._got.pop(rid, None)
        if got is None or got[0] != "ok":
            if got is not None:
                debug(1, f"forked search: the child failed ({got[1]}); searching in-process")
            return None
        return got[1]

    def serving(self) -> bool:
        """Whether the child answers requests now (not while it does work the caller will wait for)."""
        return self._slot is not None and not self._failed and self._flags[32] == 1

    def drop(self, rid: int) -> None:
        """Request `rid` is wanted no more (its answer, if it comes, is let be)."""
        if self._get(0) == rid:
            self._set(0, 0)

    def _drain(self, block: bool) -> None:
        import select

        while not self._failed:  # one wait at most, then what has come
            if not select.select([self._res], [], [], None if block else 0)[0]:
                return
            block = False
            data = os.read(self._res, 1 << 20)
            if not data:
                self._failed = True
                return
            self._buffer += data
            for kind, *rest in _frames(self._buffer):
                if kind == "message":
                    self._messages.append(tuple(rest))
                elif kind == "served":
                    rid, status, value, added = rest
                    self._got[rid] = (status, value)
                    _merge(added, self.tables)
                else:  # shared entries
                    _merge(rest[0], self.tables)

    def _get(self, at: int) -> int:
        return int.from_bytes(self._flags[at:at + 8], "little")

    def _set(self, at: int, value: int) -> None:
        self._flags[at:at + 8] = value.to_bytes(8, "little")

    def close(self) -> None:
        """End the child (nothing more of it is wanted) and reap it; again, nothing."""
        if self._res is None:
            return
        try:
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # reaped already
        os.close(self._bell)
        os.close(self._res)
        self._res, self._failed = None, True


SEPARATE = ("tiles.subgraph", "tiles.named", "tiles.above")  # served searches keep their own answers apart

_SERVING: _Child | None = None  # in a child with requests to answer: itself


def serve_point() -> None:
    """In a forked child: answer the caller's newest request if it still wants it (else nothing)."""
    if _SERVING is not None and _SERVING.serving:
        _SERVING.poll(block=False)


@contextlib.contextmanager
def unserved() -> Iterator[None]:
    """In a forked child: no requests answered inside (work the caller will wait for comes first)."""
    if _SERVING is None:
        yield
        return
    _SERVING.serving = False
    _SERVING.parent._flags[32] = 0
    try:
        yield
    finally:
        _SERVING.serving = True
        _SERVING.parent._flags[32] = 1


class _Child:
    def __init__(self, parent: Forked, fn, serve, safe, bell: int, res_write: int):
        from engine.memo import current

        self.parent, self.fn, self.serve, self.safe = parent, fn, serve, safe
        self.serving = True
        self.bell, self.res = bell, res_write
        os.set_blocking(bell, False)
        self.version = 0  # of the request slot, as last read
        self.apart = _Apart(current())
        tables = parent.tables
        self.known = {name: {k for k, _ in memo(name, limit).items()} for name, limit in tables.items()}
        self.shared = {name: set(keys) for name, keys in self.known.items()}
        self.served = {name: set() for name in tables if name in SEPARATE}  # the served tables start empty

    def run(self) -> None:
        global _SERVING
        if self.serve is not None:
            _SERVING = self
            self.parent._flags[32] = 1

        def send(value: Any) -> None:
            _send(self.res, ("message", "ok", value, self._added(self.known, lambda name, v: True)))

        send.share = lambda: _send(self.res, ("shared", self._added(self.shared, self.safe)))
        try:
            self.fn(send)
        except BaseException as exc:  # noqa: BLE001 -- any failure: the caller plans in-process
            _send(self.res, ("message", "error", f"{type(exc).__name__}: {exc}", {}))
            return
        while self.serve is not None and self.poll(block=True):
            pass

    def _added(self, known: dict, keep) -> dict:
        """The entries of the tables in `known` not in it yet (added to it) that `keep(name, value)` allows."""
        added = {}
        for name in known:
            new = [(k, v) for k, v in memo(name, self.parent.tables[name]).items() if k not in known[name]]
            known[name].update(k for k, _ in new)
            added[name] = [(k, v) for k, v in new if keep(name, v)]
        return added

    def poll(self, block: bool) -> bool:
        """Answer the newest request if it is still wanted (`block`: wait for one first). False once the
        caller has closed."""
        import select

        parent = self.parent
        if block:
            select.select([self.bell], [], [], None)
        try:
            while True:
                if not os.read(self.bell, 1 << 16):
                    return False
        except BlockingIOError:
            pass
        version = parent._get(16)
        if version == self.version:
            return True
        # The slot as it was between two writes (a version read before and after). A torn read the versions
        # missed would fail to unpickle: the exception ends this child's work, and the caller plans in-process.
        while True:
            if version % 2 == 0:
                data = bytes(parent._slot[:parent._get(24)])
                if parent._get(16) == version:
                    break
            version = parent._get(16)
        self.version = version
        rid, request = pickle.loads(data)
        if parent._get(0) != rid:
            return True  # taken over by the caller
        parent._set(8, rid)
        self.serving = False  # a serve point inside the served search answers nothing (no request in a request)
        try:
            with self.apart.active():
                try:
                    reply = (rid, "ok", self.serve(request))
                except BaseException as exc:  # noqa: BLE001 -- the caller searches in-process
                    reply = (rid, "error", f"{type(exc).__name__}: {exc}")
                added = self._added(self.served, self.safe)
        finally:
            self.serving = True
        _send(self.res, ("served",) + reply + (added,))
        return True


class _Apart(Caches):
    """The tables served work runs with: `SEPARATE` ones of its own, the rest those of `base`."""

    def __init__(self, base: Caches):
        super().__init__("served")
        self.base = base

    def memo(self, name: str, limit: int):
        return super().memo(name, limit) if name in SEPARATE else self.base.memo(name, limit)


def _merge(added: Mapping[str, list], tables: Mapping[str, int]) -> None:
    for name, entries in added.items():
        table = memo(name, tables[name])
        for k, v in entries:
            if not table.has(k):
                table.put(k, v)


def _send(fd: int, message: tuple) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[os.write(fd, data):]


def _frames(buffer: bytearray) -> list:
    """The whole messages at the front of `buffer`, unpickled and taken out of it."""
    out = []
    while len(buffer) >= 8:
        size = int.from_bytes(buffer[:8], "little")
        if len(buffer) < 8 + size:
            break
        out.append(pickle.loads(bytes(buffer[8:8 + size])))
        del buffer[:8 + size]
    return out
