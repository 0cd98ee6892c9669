"""The schedule cache: the tile search's answers kept on disk between processes.

Planning a real model is mostly the welder walk's tile searches (engine/schedule/tiles.py `search_group`),
and within a process their answers are memoised by subgraph signature (tables "tiles.subgraph" and, for
bounded merge trials, "tiles.above"): repeated layers cost one search. This module keeps those two tables
on disk, so a model planned before — by the CLI, the workbench, a benchmark — or one sharing its layers
(bert12 after bert_layer) is planned again from them: the zoo's welder plans take 0.1-1.1 s warm against
1-12 s cold, and are the same plans (benchmarks/RESULTS.md "schedcache").

Entries are pure functions of their keys (engine/memo.py): a group's canonical signature, pinned tiles,
the plan options that change a search, and the device. What the keys cannot see is the code, so one file
holds one version of it: the hash of every engine source (and the C loop runtime, which the host device's
figures come from). A change to any source starts a new file; the folder keeps the files of the VERSIONS most recent
versions.
Files are split per device (the hash of its figures): a plan reads only its device's file.

Loaded into the current memo tables (`memo.current()`: the process's, or a workbench session's) at the
first plan for that device, and the entries the plan added are merged into the file after it (re-read,
merged, written atomically: processes planning at once lose at most each other's newest entries, never
the file). A file that cannot be read is treated as empty; a write that fails is skipped: the cache can
make planning faster, never make it fail. TILEWEAVE_SCHEDULE_CACHE=off turns it off (the test suite does:
tests that count the searches' builds need a cold start).

The files are Python pickles in the user's own cache folder (TILEWEAVE_CACHE), as the compile caches there
are trusted artefacts of this user's runs: never point TILEWEAVE_CACHE at a folder others can write.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path

from engine.device import Device
from engine.flags import cache_dir, debug, switch
from engine.memo import Caches, current
from engine.schedule.tiles import SEARCH_TABLE_LIMIT

TABLES = ("tiles.subgraph", "tiles.above")  # the search's answers; "tiles.named" is derived from them
LIMIT = 20000  # entries per file (the oldest leave first)
VERSIONS = 8  # code versions the folder keeps files of (this one and the most recently written others)
_VERSION: list[str] = []


def enabled() -> bool:
    """TILEWEAVE_SCHEDULE_CACHE: on (the default) or off; anything else is a one-line error."""
    return switch("TILEWEAVE_SCHEDULE_CACHE", "every plan searches from scratch")


def code_version() -> str:
    """Hash of every engine source, the C loop runtime (flags.c_loops) and the Python version (pickles)."""
    if not _VERSION:
        from engine.flags import c_loops

        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256(f"{sys.version_info[:2]}|{c_loops()}".encode())
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        _VERSION.append(h.hexdigest()[:16])
    return _VERSION[0]


def cache_file(device: Device) -> Path:
    """This code version's file for `device` (by the hash of its figures)."""
    shard = hashlib.sha256(device.to_json().encode()).hexdigest()[:12]
    return cache_dir() / "schedule" / f"{code_version()}-{shard}.pkl"


def load(device: Device, caches: Caches | None = None) -> int:
    """Fill `caches`' (default: the current) search tables from `device`'s file, once per file and
    Caches; entries already in a table are kept. Returns how many entries were added."""
    opened = _open(device, caches)
    if opened is None:
        return 0
    caches, path, seen = opened
    if seen.get(path) is not None:
        return 0
    stored = _read(path)
    added = 0
    loaded = {}
    for name in TABLES:
        table = caches.memo(name, SEARCH_TABLE_LIMIT)
        entries = stored.get(name, {})
        for key, value in entries.items():
            if not table.has(key):
                table.put(key, value)
                added += 1
        loaded[name] = set(entries)
    seen.put(path, loaded)
    debug(2, f"schedule cache: {added} entries from {path}")
    return added


def save(device: Device, caches: Caches | None = None) -> int:
    """Merge the entries for `device` that `caches` (default: the current) holds and its file does not
    into the file. Returns how many were new."""
    opened = _open(device, caches)
    if opened is None:
        return 0
    caches, path, seen = opened
    loaded = seen.get(path) or {name: set() for name in TABLES}
    # a key's third item is its device (tiles.py): only this device's entries go to its file
    new = {name: {k: v for k, v in caches.memo(name, SEARCH_TABLE_LIMIT).items()
                  if k[2] == device and k not in loaded[name]} for name in TABLES}
    count = sum(len(v) for v in new.values())
    if not count:
        return 0
    stored = _read(path)
    merged = {}
    for name in TABLES:
        entries = dict(stored.get(name, {}))
        entries.update(new[name])
        if len(entries) > LIMIT:
            entries = dict(list(entries.items())[-LIMIT:])
        merged[name] = entries
    try:
        from engine.files import write_atomic

        write_atomic(path, pickle.dumps(merged, protocol=pickle.HIGHEST_PROTOCOL))
        _prune(path.parent, keep=path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError) as e:
        debug(2, f"schedule cache: not written ({e})")
        return 0
    seen.put(path, {name: set(merged[name]) for name in TABLES})
    debug(2, f"schedule cache: {count} new entries to {path}")
    return count


def _open(device: Device, caches: Caches | None):
    """(the Caches, `device`'s file, the Caches' table of files loaded: path -> keys per table), or None
    where the cache is off or its folder unusable."""
    if not enabled():
        return None
    path = _usable_file(device)
    if path is None:
        return None
    caches = caches or current()
    return caches, path, caches.memo("schedcache.files", 64)


def _usable_file(device: Device) -> Path | None:
    """`cache_file(device)`, or None where the cache folder cannot be made (TILEWEAVE_CACHE names a file, a
    read-only place): planning goes on without the cache."""
    try:
        return cache_file(device)
    except OSError as e:
        debug(2, f"schedule cache: off for this plan, its folder is unusable ({e})")
        return None


def _read(path: Path) -> dict:
    """The file's tables, or {} where it is missing or cannot be read (a damaged or foreign file)."""
    try:
        data = pickle.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except Exception as e:  # noqa: BLE001 — any unreadable file is an empty cache, never an error
        debug(2, f"schedule cache: {path} unreadable ({type(e).__name__}: {e}); starting it afresh")
        return {}
    if not isinstance(data, dict) or not all(isinstance(data.get(n, {}), dict) for n in TABLES):
        return {}
    return data


def _prune(folder: Path, keep: Path) -> None:
    """Keep every file of this code version and those of the VERSIONS - 1 other versions written last."""
    mine = keep.name.split("-")[0]
    newest: dict[str, float] = {}
    files = [(f, f.name.split("-")[0], f.stat().st_mtime) for f in folder.glob("*.pkl")]
    for _, version, mtime in files:
        if version != mine:
            newest[version] = max(newest.get(version, 0.0), mtime)
    kept = set(sorted(newest, key=newest.__getitem__, reverse=True)[:VERSIONS - 1])
    for f, version, _ in files:
        if version != mine and version not in kept:
            f.unlink(missing_ok=True)
