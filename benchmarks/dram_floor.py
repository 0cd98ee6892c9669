"""Modeled DRAM traffic against the floor (inputs, weights and outputs moved once) for zoo models on GPU presets
(issue 12 item 5): one JSON line per model x device x policy with DRAM x floor, the per-kernel cold-cache
figure, modeled us and kernels. Modeled only, nothing runs.

    PYTHONPATH=$PWD python benchmarks/dram_floor.py [--models bert,lstm] [--devices a100,h200] [--policies welder,stitch]
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.device import get_device  # noqa: E402
from engine.frontend.importer import load_graph  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated zoo models (default: all)")
    p.add_argument("--devices", default="a100,h200")
    p.add_argument("--policies", default="welder,stitch")
    args = p.parse_args()
    zoo = ROOT / "samples" / "zoo"
    models = [m for m in args.models.split(",") if m] or sorted(f.stem for f in zoo.glob("*.onnx"))
    for name in models:
        graph = load_graph(zoo / f"{name}.onnx")
        for dev in args.devices.split(","):
            for policy in args.policies.split(","):
                t = time.process_time()
                planned, plan = plan_model(graph, policy, get_device(dev))
                floor = planned.min_dram_bytes
                print(json.dumps({"model": name, "device": dev, "policy": policy,
                                  "x_floor": round(plan.dram_bytes / floor, 3),
                                  "x_floor_cold": round(plan.dram_bytes_cold / floor, 3), "dram": plan.dram_bytes,
                                  "floor": floor, "us": round(plan.modeled_us, 2), "kernels": len(plan.groups),
                                  "cpu_s": round(time.process_time() - t, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
