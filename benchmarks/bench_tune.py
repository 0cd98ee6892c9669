"""Wall time of `tileweave tune` (issue 16, part 1) on zoo models: in this process, on an embedded Ray
with 1 worker, and with 2 workers (or --workers), each from a cold start: a fresh tuning database and a
fresh compile cache (the host's probed figures are copied in, so no run probes the CPU again), then a
second run of the last configuration, served from its database. Prints a Markdown table.

    .venv/bin/python benchmarks/bench_tune.py [--models nerf,lstm,mobilenetv2] [--tune 2] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "samples" / "zoo"


def host_figures() -> Path:
    """This machine's probed host figures (probing once if needed), to seed every cold cache."""
    from engine.host import cache_path, host_device

    host_device()
    return cache_path()


def run(models: list[str], k: int, mode: str, cache: Path, seed: Path) -> dict:
    """One `tileweave tune` run in a fresh process with `cache` as its cache folder; its JSON and wall time."""
    (cache / "host").mkdir(parents=True, exist_ok=True)
    shutil.copy(seed, cache / "host" / seed.name)
    argv = [sys.executable, "-m", "engine", "tune", *[str(ZOO / f"{m}.onnx") for m in models], "--device", "host",
            "--tune", str(k), "--db", str(cache / "tune.sqlite"), "--json"]
    argv += ["--in-process"] if mode == "in-process" else ["--workers", mode]
    env = dict(os.environ, TILEWEAVE_CACHE=str(cache))
    env.pop("RAY_ADDRESS", None)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return {"wall_s": seconds, **json.loads(done.stdout)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="nerf,lstm,mobilenetv2")
    ap.add_argument("--tune", type=int, default=2)
    ap.add_argument("--workers", default="1,2", help="embedded Ray sizes to time (comma-separated)")
    args = ap.parse_args()
    models = args.models.split(",")
    seed = host_figures()
    modes = ["in-process", *args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        for mode in modes:
            cache = Path(tmp) / mode
            result = run(models, args.tune, mode, cache, seed)
            rows.append((mode, result))
            print(f"... {mode}: {result['wall_s']:.1f} s, {result['tasks']} tasks", file=sys.stderr, flush=True)
        again = run(models, args.tune, modes[-1], Path(tmp) / modes[-1], seed)
        rows.append((f"{modes[-1]}, second run", again))
    base = next(r["wall_s"] for m, r in rows if m == "1") if "1" in modes else rows[0][1]["wall_s"]
    print(f"models: {', '.join(models)}; --tune {args.tune}; device host; {os.cpu_count()} cores")
    print()
    print("| run | wall s | tasks measured | db hits | vs 1 worker |")
    print("|---|---:|---:|---:|---:|")
    for mode, r in rows:
        label = mode if not mode.isdigit() else f"Ray, {mode} worker(s)"
        print(f"| {label} | {r['wall_s']:.1f} | {r['tasks']} | {r['db_hits']} | {base / r['wall_s']:.2f}× |")
    print()
    print("| model | policy | kernels | candidates | untuned µs | tuned µs |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows[0][1]["rows"]:
        print(f"| {r['model']} | {r['policy']} | {r['kernels']} | {r['candidates']} | {r['untuned_us']} | {r['tuned_us']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
