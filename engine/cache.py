"""The cache folder (`flags.cache_dir()`, TILEWEAVE_CACHE): what each part holds, how much, and trimming it
(`tileweave cache`). The compile caches grow with every program compiled and nothing else bounds them (this
project's development machine held 75,918 files, 1.2 GB, in `cc/` after a few weeks of test runs); a hit
marks its file used (`touch`), so `prune` removes the least recently used first."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import TileweaveError
from engine.flags import cache_dir
from engine.runtime.budget import parse_size


@dataclass(frozen=True)
class Part:
    name: str
    holds: str
    rebuilt: bool  # made again on demand when removed (else it is a measurement worth keeping)


PARTS = (
    Part("cc", "compiled C programs and kernel objects (the cpu backend)", True),
    Part("nvrtc", "compiled CUDA: PTX and CUBIN per kernel unit and arch; failed sources and logs", True),
    Part("schedule", "tile searches of earlier plans, per code version (kept for the 8 newest)", True),
    Part("host", "this machine's measured device figures (tileweave device host)", False),
    Part("tune", "measured kernel times of --tune, by subgraph signature", False),
    Part("edits", "the workbench's autosaved plan edits, per model", False),
    Part("uploads", "models uploaded to the workbench", False),
)
COMPILED = ("cc", "nvrtc")  # what `prune` trims
TEMP_GRACE_S = 3600.0  # a temporary file (a compile in flight) younger than this is left alone
DEFAULT_MAX = 5 * 1024 ** 3  # what the compile caches may hold before a compile trims them (TILEWEAVE_CACHE_MAX)
TRIM_EVERY_S = 86400.0  # at most one automatic trim a day per cache folder (its `.trimmed` stamp)
_TRIMMING = threading.Lock()


def touch(path: Path) -> None:
    """Mark a cache entry used now (a hit): `prune` removes the least recently used entries first."""
    try:
        os.utime(path)
    except OSError:
        pass


def max_bytes(strict: bool = False) -> int | None:
    """TILEWEAVE_CACHE_MAX (a size: 5G, 800M; 0 or off: unbounded), else DEFAULT_MAX. A bad value is
    DEFAULT_MAX (a compile must not fail on it), or with `strict` (`tileweave cache`) a TileweaveError."""
    raw = os.environ.get("TILEWEAVE_CACHE_MAX", "").strip()
    if not raw:
        return DEFAULT_MAX
    if raw.lower() in ("0", "off", "none"):
        return None
    try:
        return parse_size(raw, "TILEWEAVE_CACHE_MAX")  # the sizes --memory-budget takes
    except TileweaveError:
        if strict:
            raise
        return DEFAULT_MAX


def trim_soon() -> None:
    """After a compile wrote an entry: at most once a day per cache folder, trim the compile caches to
    `max_bytes()` (least recently used first) in a background thread, so no compile waits for the scan
    (~2.6 s over 76,000 files)."""
    limit = max_bytes()
    if limit is None or _TRIMMING.locked():
        return
    try:
        stamp = cache_dir() / ".trimmed"
        if stamp.exists() and time.time() - stamp.stat().st_mtime < TRIM_EVERY_S:
            return
        stamp.touch()
    except OSError:
        return
    root = stamp.parent

    def work() -> None:
        with _TRIMMING:
            try:
                prune(limit, root)
            except OSError:
                pass

    threading.Thread(target=work, name="tileweave-cache-trim", daemon=True).start()


def usage(root: Path | None = None) -> list[dict]:
    """Per part (and `other` for anything else in the folder): files, bytes, what it holds, whether it is
    rebuilt on demand."""
    root = root or cache_dir()
    rows, known = [], {p.name for p in PARTS}
    for part in PARTS:
        files, size = _measure(root / part.name)
        rows.append({"part": part.name, "files": files, "bytes": size, "holds": part.holds, "rebuilt": part.rebuilt})
    other = [p for p in root.iterdir() if p.name not in known and not p.name.startswith(".")] if root.is_dir() else []
    if other:
        counts = [_measure(p) for p in other]
        rows.append({"part": "other", "files": sum(c[0] for c in counts), "bytes": sum(c[1] for c in counts),
                     "holds": ", ".join(sorted(p.name for p in other)), "rebuilt": False})
    return rows


def _measure(path: Path) -> tuple[int, int]:
    if path.is_file():
        return 1, path.stat().st_size
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                size += os.stat(os.path.join(dirpath, n)).st_size
                files += 1
            except OSError:
                pass  # removed meanwhile
    return files, size


def _entries(root: Path) -> list[tuple[float, int, list[Path]]]:
    """The compiled parts' entries as (last used, bytes, files): a C program's source and library are one
    entry (NAME-KEY.*), a CUDA unit one file, a kernel object one file. Folders of compiles in flight and
    NVRTC's per-process precompiled headers (nvrtc/pch, managed by engine.codegen.nvrtc) are left out."""
    groups: dict[tuple[Path, str], list[Path]] = {}
    now = time.time()
    for part in COMPILED:
        for dirpath, dirnames, names in os.walk(root / part):
            here = Path(dirpath)
            dirnames[:] = [d for d in dirnames if not (here == root / "nvrtc" and d == "pch") and not d.startswith(".")]
            for n in names:
                path = here / n
                if n.startswith("."):  # a temporary file: only one left behind long ago
                    try:
                        if now - path.stat().st_mtime < TEMP_GRACE_S:
                            continue
                    except OSError:
                        continue
                stem = n.lstrip(".").split(".", 1)[0]
                groups.setdefault((here, stem), []).append(path)
    out = []
    for files in groups.values():
        stats = []
        for f in files:
            try:
                stats.append(f.stat())
            except OSError:
                pass
        if stats:
            out.append((max(s.st_mtime for s in stats), sum(s.st_size for s in stats), files))
    return sorted(out, key=lambda e: e[0])


def prune(limit: int, root: Path | None = None) -> tuple[int, int]:
    """Remove the least recently used entries of the compiled parts (cc, nvrtc) until they hold at most
    `limit` bytes; (entries removed, bytes removed). Measurements (host, tune) are never touched."""
    root = root or cache_dir()
    entries = _entries(root)
    total = sum(e[1] for e in entries)
    removed = freed = 0
    for _, size, files in entries:
        if total <= limit:
            break
        for f in files:
            f.unlink(missing_ok=True)
        total -= size
        freed += size
        removed += 1
    return removed, freed


def clear(root: Path | None = None) -> list[str]:
    """Empty every part that is rebuilt on demand (cc, nvrtc, schedule), all but NVRTC's per-process precompiled
    headers; the measurements and the workbench's files stay. The parts emptied, by name."""
    root = root or cache_dir()
    gone = []
    for part in PARTS:
        folder = root / part.name
        if not part.rebuilt or not folder.exists():
            continue
        for item in folder.iterdir():
            if part.name == "nvrtc" and item.name == "pch":
                continue  # running compiles' precompiled headers (engine.codegen.nvrtc sweeps the dead ones)
            if item.is_dir():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
        gone.append(part.name)
    return gone
