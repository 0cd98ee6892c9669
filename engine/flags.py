"""Environment flags, declared once.

DEBUG=1 plan summary, 2 per-kernel numbers and the memo tables' hits and misses (engine/memo.py),
3 every decision with its reason, 4 generated source, 5 IR after each stage. DUMP_DIR=path writes graph, plans, kernels, profile and a repro.sh.
TILEWEAVE_CACHE=path overrides the compile cache folder (default: ~/.cache/tileweave).
TILEWEAVE_CACHE_MAX=size bounds its compile caches, trimmed least recently used first once a day (engine/cache.py; 5G).
TILEWEAVE_SCHEDULE_CACHE=off plans without the schedule cache on disk (engine/schedule/schedcache.py; on by default).
TILEWEAVE_PLAN_FORK=off plans welder in-process only, with no forked child beside its walk (engine/schedule/forked.py;
on by default where a core is spare and the process has one thread).
TILEWEAVE_TUNE_DB=file is the tuning database (default: tune/tune.sqlite in the cache folder; tunedb.py).
UPDATE_GOLDEN=1 rewrites tests/golden/.
TILEWEAVE_SIM_STACK=KiB sets the stack of each emulated CUDA thread in cuda-sim (default 256).
TILEWEAVE_TIME_LIMIT=SECONDS bounds each compile and each run, as `--time-limit` (docs/reliability.md).
"""

from __future__ import annotations

import os
from pathlib import Path

DEBUG: int = int(os.environ.get("DEBUG", "0") or 0)
DUMP_DIR: Path | None = Path(os.environ["DUMP_DIR"]) if os.environ.get("DUMP_DIR") else None
UPDATE_GOLDEN: bool = os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")


def sim_stack_kib() -> int:
    """TILEWEAVE_SIM_STACK: KiB of stack per emulated CUDA thread (cuda-sim); 256 unless set."""
    raw = os.environ.get("TILEWEAVE_SIM_STACK", "").strip()
    if not raw:
        return 256
    if not raw.isdigit() or not 16 <= int(raw) <= 65536:
        from engine.errors import BackendError

        raise BackendError(f"TILEWEAVE_SIM_STACK={raw!r} is not a stack size in KiB",
                           hint="use a whole number from 16 to 65536, or unset it")
    return int(raw)


def switch(name: str, off_means: str) -> bool:
    """An on/off flag `name`: on (unset, "on" or "1") or off ("off" or "0"); anything else is a one-line error
    whose hint says what off does (`off_means`)."""
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "on", "1"):
        return True
    if raw in ("off", "0"):
        return False
    from engine.errors import TileweaveError

    raise TileweaveError(f"{name}={raw!r} is not on or off", hint=f"use on or off (off: {off_means}), or unset it")


def c_loops() -> str:
    """TILEWEAVE_C_LOOPS: who runs the C backend's parallel tile loops — "pool" (the default: the generated
    C's own work-claiming thread pool) or "omp" (OpenMP parallel for loops). With any other process on the
    cores an OpenMP loop waits out its time slice at the closing barrier (decoder_kv beside a test run:
    15.5 ms on OpenMP, 0.087 on the pool; at load 12-22: pool 3-1000x faster by median); on a quiet
    machine OpenMP's spinning team is as fast or faster (pool/OpenMP by best round 0.97-1.32x, by median
    1.0-1.9x): "omp" for a dedicated quiet machine. benchmarks/RESULTS.md, "pool", "lead-2026-11-26g"."""
    raw = os.environ.get("TILEWEAVE_C_LOOPS", "").strip().lower() or "pool"
    if raw not in ("pool", "omp"):
        from engine.errors import BackendError

        raise BackendError(f"TILEWEAVE_C_LOOPS={raw!r} is not a loop runtime", hint="use pool or omp, or unset it")
    return raw


def time_limit_s(value: str | float | None = None, *, source: str = "--time-limit") -> float | None:
    """Seconds each compile and each run may take: `value` (a flag's), else TILEWEAVE_TIME_LIMIT, else
    None (no limit, the C compiler's own 600 s aside). A value that is not a positive number: one line."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value, source = os.environ.get("TILEWEAVE_TIME_LIMIT", "").strip(), "TILEWEAVE_TIME_LIMIT"
        if not value:
            return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        from engine.errors import TileweaveError

        raise TileweaveError(f"{source} {value!r} is not a time limit in seconds",
                             hint="give a positive number such as 60 or 0.5")
    return seconds


def cache_dir() -> Path:
    """Folder for on-disk compile caches (created on demand)."""
    root = os.environ.get("TILEWEAVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tileweave"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def debug(level: int, message: str) -> None:
    """Print `message` to stderr when DEBUG >= level."""
    if DEBUG >= level:
        import sys

        print(f"[tileweave:{level}] {message}", file=sys.stderr)


def dump(name: str, content: str | bytes) -> None:
    """Write one artifact of the trail to DUMP_DIR (no-op when unset)."""
    if DUMP_DIR is None:
        return
    DUMP_DIR.mkdir(parents=True, exist_ok=True)
    path = DUMP_DIR / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
