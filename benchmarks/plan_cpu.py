"""Planning cost per policy, for comparing two trees: one model and device in; per policy the CPU seconds
of `plan_model` (`time.process_time`, one process, policies in turn on the same memo tables) and the
kernel-IR builds the cost model made (calls of `cost._segment_use`) printed, and with --out each plan's
JSON without schedule_seconds written there (diff two trees' folders to see whether plans changed).

    PYTHONPATH=TREE .venv/bin/python benchmarks/plan_cpu.py samples/zoo/bert.onnx a100 --out /tmp/plans"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.device import get_device
from engine.errors import TileweaveError
from engine.frontend.importer import load_graph
from engine.schedule import cost
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import plan_to_json

POLICIES = ("unfused", "elementwise", "stitch", "welder")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("device")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--out", type=Path, help="folder for the plans' JSON (NAME.DEVICE.POLICY.json)")
    args = parser.parse_args()
    try:
        graph, device = load_graph(args.model), get_device(args.device)
    except (TileweaveError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    builds = [0]
    build = cost._segment_use

    def counted(*a, **k):
        builds[0] += 1
        return build(*a, **k)

    cost._segment_use = counted  # counts the builds; the function itself runs unchanged
    name = Path(args.model).stem
    for policy in args.policies.split(","):
        before, t0 = builds[0], time.process_time()
        _, plan = plan_model(graph, policy, device)
        seconds = time.process_time() - t0
        print(f"{name} {args.device} {policy} cpu {seconds:.2f} builds {builds[0] - before} "
              f"modeled_us {sum(g.score or 0 for g in plan.groups):.4g}", flush=True)
        if args.out:
            data = plan_to_json(plan)
            data.pop("schedule_seconds", None)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{name}.{args.device}.{policy}.json").write_text(json.dumps(data, sort_keys=True, indent=1))


if __name__ == "__main__":
    main()
