"""The compiler's memo tables as explicit objects: a `Caches` holds one bounded, thread-safe `Memo` per
named table (the tile search's subgraph cache, segment uses, region propagation, tile checks, the work
count's per-expression memos, ...), each counting its hits and misses.

Whose tables: the `Caches` active in the current context (`with caches.active(): ...`), else the
process's own. The workbench gives each browser session its own `Caches` (Streamlit runs sessions on
threads; a context variable keeps them apart), the CLI and the tests use the process's. `DEBUG=2` prints
every table's size, hits and misses after planning and at the end of a command.

Entries are pure functions of their keys: a key must hold everything the value depends on (a graph's
structural hash, canonical subgraph signatures, tiles, the device), so a hit in one session is right in
any other. Values are computed outside the table's lock (two threads may compute the same entry once
each; both results are equal).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

_MISSING = object()


class Memo:
    """One named table: least recently used entries leave past `limit`; `hits`/`misses` count lookups."""

    def __init__(self, name: str, limit: int):
        if limit < 1:
            raise ValueError(f"memo {name}: limit must be positive")
        self.name, self.limit = name, limit
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value stored under `key` (counted as a hit), else `default` (a miss)."""
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                self.misses += 1
                return default
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def has(self, key: Hashable) -> bool:
        """Whether `key` is stored (not counted as a lookup, nor made recent)."""
        with self._lock:
            return key in self._data

    def items(self) -> list[tuple[Hashable, Any]]:
        """A snapshot of the entries, least recently used first (not counted)."""
        with self._lock:
            return list(self._data.items())

    def put(self, key: Hashable, value: Any) -> Any:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.limit:
                self._data.popitem(last=False)
        return value

    def lookup(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """table[key], computed (outside the lock) and stored on a miss."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = self.put(key, compute())
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def raw(self) -> dict:
        """The table itself as a dict, for a recursive helper that memoises node by node (kexpr.strip,
        free_vars): emptied first when past its limit; such use is not counted."""
        with self._lock:
            if len(self._data) > self.limit:
                self._data.clear()
            return self._data

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._data), "limit": self.limit, "hits": self.hits, "misses": self.misses}


class Caches:
    """The memo tables of one compiler session, created on first use by name."""

    def __init__(self, label: str = "session"):
        self.label = label
        self._tables: dict[str, Memo] = {}
        self._lock = threading.Lock()

    def memo(self, name: str, limit: int) -> Memo:
        table = self._tables.get(name)
        if table is None:
            with self._lock:
                table = self._tables.setdefault(name, Memo(name, limit))
        return table

    def clear(self) -> None:
        for table in list(self._tables.values()):
            table.clear()

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: t.stats() for name, t in sorted(self._tables.items())}

    def report(self) -> str:
        """One line per table: entries, hits, misses and the hit rate."""
        lines = [f"memo tables ({self.label}):"]
        for name, s in self.stats().items():
            looked = s["hits"] + s["misses"]
            rate = f"{100 * s['hits'] / looked:.0f}%" if looked else "-"
            lines.append(f"  {name:<24} {s['entries']:>7} entries  {s['hits']:>9} hits  {s['misses']:>8} misses  {rate:>4}")
        return "\n".join(lines)

    @contextlib.contextmanager
    def active(self) -> Iterator[Caches]:
        """Make these the tables every memoised step in this context uses."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


PROCESS = Caches("process")
_CURRENT: contextvars.ContextVar[Caches | None] = contextvars.ContextVar("tileweave_caches", default=None)


def current() -> Caches:
    """The Caches of the current context: the active session's, else the process's."""
    return _CURRENT.get() or PROCESS


def memo(name: str, limit: int) -> Memo:
    """The current Caches' table `name` (created with `limit` on first use)."""
    return (_CURRENT.get() or PROCESS).memo(name, limit)


def report_at_debug() -> None:
    """The current tables' statistics on stderr when DEBUG >= 2."""
    from engine.flags import DEBUG, debug

    if DEBUG >= 2:
        debug(2, current().report())
