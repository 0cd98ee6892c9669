"""Planning cold and warm: per model and device, the welder plan made in a fresh process with an empty
schedule cache (engine/schedule/schedcache.py), then again in another fresh process that finds the first
one's file; the seconds `plan_model` took in each (wall and CPU) and whether the two plans are the same
(`plan_to_json` without schedule_seconds). `--after M` plans model M first (its own cold process) so the
cold-then-warm pair shows what a model sharing its layers gains (bert12 after bert_layer).

    .venv/bin/python benchmarks/bench_schedcache.py [MODEL|zoo|samples,...] [--devices a100,host]
        [--policy welder] [--after samples/bert_layer.onnx]

Each (model, device) gets a new cache folder holding only the host probe's figures, copied from the user's
cache so the host is not probed again.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {"zoo": ROOT / "samples" / "zoo", "samples": ROOT / "samples"}

_CHILD = r"""
import json, sys, time
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import plan_to_json
device, graph = get_device(sys.argv[2]), load_graph(sys.argv[1])
w0, c0 = time.perf_counter(), time.process_time()
_, plan = plan_model(graph, sys.argv[3], device)
w1, c1 = time.perf_counter(), time.process_time()
out = plan_to_json(plan)
out.pop("schedule_seconds", None)
print(json.dumps({"wall": w1 - w0, "cpu": c1 - c0, "plan": json.dumps(out, sort_keys=True)}))
"""


def models_of(spec: str) -> list[Path]:
    out: list[Path] = []
    for part in spec.split(","):
        out += sorted(SETS[part].glob("*.onnx")) if part in SETS else [Path(part)]
    return out


def plan_in_process(model: Path, device: str, policy: str, cache: Path) -> dict:
    env = dict(os.environ, TILEWEAVE_CACHE=str(cache), TILEWEAVE_SCHEDULE_CACHE="on", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model), device, policy], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="?", default="samples/bert12.onnx,zoo")
    p.add_argument("--devices", default="a100,host")
    p.add_argument("--policy", default="welder")
    p.add_argument("--after", help="plan this model first, so the warm pair shows what shared layers gain")
    args = p.parse_args()
    from engine.flags import cache_dir

    probes = cache_dir() / "host"
    print("| model | device | cold s (wall / CPU) | warm s (wall / CPU) | cold / warm (wall) | same plan |")
    print("|---|---|---:|---:|---:|---|")
    for model in models_of(args.models):
        for device in args.devices.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp)
                if probes.is_dir():
                    shutil.copytree(probes, cache / "host")
                if args.after:
                    plan_in_process(Path(args.after), device, args.policy, cache)
                cold = plan_in_process(model, device, args.policy, cache)
                warm = plan_in_process(model, device, args.policy, cache)
            print(f"| {model.stem}{' after ' + Path(args.after).stem if args.after else ''} | {device} | "
                  f"{cold['wall']:.2f} / {cold['cpu']:.2f} | {warm['wall']:.2f} / {warm['cpu']:.2f} | "
                  f"{cold['wall'] / warm['wall']:.1f}x | {'yes' if cold['plan'] == warm['plan'] else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
