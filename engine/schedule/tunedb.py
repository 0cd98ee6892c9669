"""The tuning database: measured kernel times keyed by (subgraph signature, device name, device-figures
hash, code version), in SQLite (default `cache_dir()/tune/tune.sqlite`, `--db FILE`,
TILEWEAVE_TUNE_DB), exported and imported as JSON lines of the same rows so clusters' results merge.

One row is one measurement of one kernel by one task (the median of its launches; two identical layers
of a model are two rows of one signature). A task's rows are written with INSERT OR IGNORE on (task id,
signature, kernel), so a task that ran twice (its worker died after measuring and it was retried) is
recorded once. A lookup is the median over every row of its key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sqlite3
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from engine.device import Device
from engine.errors import TileweaveError

SCHEMA_VERSION = 1
COLUMNS = ("task_id", "signature", "device", "device_hash", "code_version", "us", "launches", "model",
           "policy", "kernel", "worker", "created")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
  task_id      TEXT NOT NULL,
  signature    TEXT NOT NULL,
  device       TEXT NOT NULL,
  device_hash  TEXT NOT NULL,
  code_version TEXT NOT NULL,
  us           REAL NOT NULL,
  launches     INTEGER NOT NULL,
  model        TEXT NOT NULL DEFAULT '',
  policy       TEXT NOT NULL DEFAULT '',
  kernel       TEXT NOT NULL DEFAULT '',
  worker       TEXT NOT NULL DEFAULT '',
  created      REAL NOT NULL,
  PRIMARY KEY (task_id, signature, kernel)
);
CREATE INDEX IF NOT EXISTS measurements_key ON measurements (signature, device, device_hash, code_version);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class TuneDBError(TileweaveError):
    """A tuning database (or its JSON-lines export) that cannot be opened, read or written."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One kernel's time from one measure task (microseconds, median of `launches` launches)."""

    task_id: str
    signature: str
    device: str
    device_hash: str
    code_version: str
    us: float
    launches: int
    model: str = ""
    policy: str = ""
    kernel: str = ""
    worker: str = ""
    created: float = 0.0

    @classmethod
    def from_dict(cls, row: Mapping, where: str) -> Measurement:
        missing = [c for c in COLUMNS[:7] if c not in row]
        if missing:
            raise TuneDBError(f"{where}: a measurement without {', '.join(missing)}",
                              hint="import a file written by tileweave tune --export-db")
        try:
            m = cls(**{c: row[c] for c in COLUMNS if c in row})
            m = dataclasses.replace(m, us=float(m.us), launches=int(m.launches), created=float(m.created or 0.0))
        except (TypeError, ValueError) as err:
            raise TuneDBError(f"{where}: a malformed measurement ({err})",
                              hint="import a file written by tileweave tune --export-db") from None
        if not (m.us >= 0 and m.us < float("inf")) or m.launches < 1:
            raise TuneDBError(f"{where}: measurement {m.signature} has us={m.us}, launches={m.launches}",
                              hint="times are finite and non-negative, launches at least 1")
        return m


def device_key(device: Device) -> tuple[str, str]:
    """(name, hash of every figure): two devices with the same name and other figures do not share rows."""
    return device.name, hashlib.sha256(device.to_json().encode()).hexdigest()[:16]


def default_db_path() -> Path:
    """TILEWEAVE_TUNE_DB, else `cache_dir()/tune/tune.sqlite`."""
    from engine.flags import cache_dir

    env = os.environ.get("TILEWEAVE_TUNE_DB", "").strip()
    return Path(env) if env else cache_dir() / "tune" / "tune.sqlite"


class TuneDB:
    """The SQLite tuning database at `path` (default `default_db_path()`); safe to share between
    processes (every write is one transaction; readers see whole tasks)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout = 60000")
            with self._transaction():
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self._conn.execute(statement)
                self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            version = self._conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
        except (OSError, sqlite3.Error) as err:
            raise TuneDBError(f"tuning database {self.path} cannot be opened: {err}",
                              hint="pass another file with --db, or delete this one to start afresh") from None
        if version != str(SCHEMA_VERSION):
            raise TuneDBError(f"tuning database {self.path} has schema {version}, this tileweave writes {SCHEMA_VERSION}",
                              hint="export it with the tileweave that wrote it, or use another --db")

    @contextlib.contextmanager
    def _transaction(self):
        """One write transaction, taken up front (BEGIN IMMEDIATE) so concurrent writers queue, not fail."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> TuneDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- reading ----

    def lookup(self, signatures: Iterable[str], device: Device, code_version: str) -> dict[str, float]:
        """Median microseconds per signature that has rows for (device, code version); the others absent."""
        name, dhash = device_key(device)
        wanted = sorted(set(signatures))
        samples: dict[str, list[float]] = {}
        for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
            chunk = wanted[start:start + 500]
            rows = self._conn.execute(
                f"SELECT signature, us FROM measurements WHERE device = ? AND device_hash = ? AND code_version = ? "
                f"AND signature IN ({','.join('?' * len(chunk))})", (name, dhash, code_version, *chunk))
            for sig, us in rows:
                samples.setdefault(sig, []).append(us)
        return {sig: statistics.median(v) for sig, v in samples.items()}

    def rows(self, *, task_ids: Sequence[str] | None = None) -> list[Measurement]:
        """Every row (or those of `task_ids`), oldest first."""
        if task_ids is None:
            cur = self._conn.execute(f"SELECT {', '.join(COLUMNS)} FROM measurements ORDER BY created, task_id, kernel")
            return [Measurement(*r) for r in cur]
        out = []
        ids = list(task_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            cur = self._conn.execute(f"SELECT {', '.join(COLUMNS)} FROM measurements WHERE task_id IN "
                                     f"({','.join('?' * len(chunk))}) ORDER BY created, task_id, kernel", chunk)
            out += [Measurement(*r) for r in cur]
        return out

    def summary(self) -> list[dict]:
        """Rows and distinct signatures per device and code version, the most rows first."""
        cur = self._conn.execute("SELECT device, device_hash, code_version, COUNT(*), COUNT(DISTINCT signature), "
                                 "MAX(created) FROM measurements GROUP BY device, device_hash, code_version "
                                 "ORDER BY COUNT(*) DESC")
        return [{"device": d, "device_hash": h, "code_version": v, "rows": n, "signatures": s, "last": t}
                for d, h, v, n, s, t in cur]

    def count(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]

    # ---- writing ----

    def record(self, rows: Iterable[Measurement]) -> int:
        """Insert `rows` in one transaction, ignoring any whose (task id, signature, kernel) is there already;
        the number inserted."""
        rows = [r for r in rows if r.us >= 0 and r.us < float("inf")]
        if not rows:
            return 0
        try:
            with self._transaction():
                before = self._conn.total_changes
                self._conn.executemany(
                    f"INSERT OR IGNORE INTO measurements ({', '.join(COLUMNS)}) VALUES ({','.join('?' * len(COLUMNS))})",
                    [dataclasses.astuple(r) for r in rows])
                return self._conn.total_changes - before
        except sqlite3.Error as err:
            raise TuneDBError(f"tuning database {self.path} cannot be written: {err}",
                              hint="check the file's permissions and free space, or pass another --db") from None

    def export_jsonl(self, path: str | Path) -> int:
        """Every row as one JSON object a line (the columns by name); the number written."""
        from engine.files import write_atomic

        rows = self.rows()
        text = "".join(json.dumps(dataclasses.asdict(r), sort_keys=True) + "\n" for r in rows)
        try:
            write_atomic(Path(path), text.encode())
        except OSError as err:
            raise TuneDBError(f"--export-db {path}: cannot write ({err.strerror or err})",
                              hint="pick a writable path") from None
        return len(rows)

    def import_jsonl(self, path: str | Path) -> tuple[int, int]:
        """Merge a JSON-lines export into this database: (rows read, rows new here)."""
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise TuneDBError(f"--import-db {path}: cannot read ({getattr(err, 'strerror', None) or err})",
                              hint="give a file written by tileweave tune --export-db") from None
        rows = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise TuneDBError(f"--import-db {path}:{n}: not a JSON object",
                                  hint="give a file written by tileweave tune --export-db") from None
            if not isinstance(obj, dict):
                raise TuneDBError(f"--import-db {path}:{n}: not a JSON object",
                                  hint="give a file written by tileweave tune --export-db")
            rows.append(Measurement.from_dict(obj, f"--import-db {path}:{n}"))
        return len(rows), self.record(rows)


def new_rows(task_id: str, signatures: Mapping[str, str], times: Mapping[str, float], device: Device,
             code_version: str, launches: int, *, model: str = "", policy: str = "", worker: str = "") -> list[Measurement]:
    """The rows of one task's result: `times` (kernel name -> us) for the kernels whose `signatures`
    (kernel name -> signature) it names."""
    name, dhash = device_key(device)
    now = time.time()
    return [Measurement(task_id, signatures[k], name, dhash, code_version, float(us), launches, model, policy, k,
                        worker, now) for k, us in sorted(times.items()) if k in signatures]
