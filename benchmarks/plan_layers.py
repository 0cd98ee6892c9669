"""Where a cold welder plan's connection walk spends its time, by the layer of each trial's consumer stage (the
`encoder.layer.N/` prefix of exported transformers, else the name's first part): trials and CPU seconds per layer,
schedule cache off (benchmarks/RESULTS.md standingmemo, issue 12 item 6).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/plan_layers.py [MODEL.onnx] [--device host] [--policy welder]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="samples/bert12.onnx")
    ap.add_argument("--device", default="host")
    ap.add_argument("--policy", default="welder")
    args = ap.parse_args(argv)
    os.environ["TILEWEAVE_SCHEDULE_CACHE"] = "off"
    import engine.schedule.build as build
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    spent: dict[str, float] = collections.defaultdict(float)
    trials: collections.Counter = collections.Counter()
    original = build._try_level

    def timed(graph, conns, edge, level, *rest, **kw):
        start = time.process_time()
        try:
            return original(graph, conns, edge, level, *rest, **kw)
        finally:
            m = re.match(r"encoder\.layer\.(\d+)/", edge[1])
            key = f"layer {m.group(1)}" if m else edge[1].split("/")[0]
            spent[key] += time.process_time() - start
            trials[key] += 1

    build._try_level = timed
    graph = load_graph(args.model)
    start = time.process_time()
    try:
        plan_model(graph, args.policy, get_device(args.device))
    finally:
        build._try_level = original
    total = time.process_time() - start
    print(f"{args.model} {args.policy} on {args.device}: {total:.2f} CPU s, {sum(spent.values()):.2f} s in "
          f"{sum(trials.values())} trials")
    print("| part | trials | CPU s |\n|---|---:|---:|")
    for key, secs in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"| {key} | {trials[key]} | {secs:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
