"""Two sets of host figures (device JSON files, e.g. a cached probe before and after a probe or model
change), one policy: per model, the plan each set makes, and where the C programs differ, both whole
programs timed in the same worker in interleaved rounds (`bench_cost_model.time_programs`), so what
differs between them is the plan, not the load of the moment.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_device_ab.py A.json B.json [--models a,b]
        [--policy welder] [--rounds 31] [--clock cpu]

Prints per model: modeled µs under each set, measured µs (median of the rounds; fastest round), B/A.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--models", default="")
    p.add_argument("--policy", default="welder")
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    args = p.parse_args()
    from bench_cost_model import time_on_host, time_programs

    from engine.device import Device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    devices = {k: Device.from_json(Path(f).read_text()) for k, f in (("A", args.a), ("B", args.b))}
    zoo = ROOT / "samples" / "zoo"
    names = [n for n in args.models.split(",") if n] or sorted(x.stem for x in zoo.glob("*.onnx"))
    print(f"| model | {args.policy} modeled A / B µs | measured A / B µs (median; fastest) | B/A measured |")
    print("|---|---:|---:|---:|")
    ratios = []
    for name in names:
        graph = load_graph(zoo / f"{name}.onnx")
        programs, modeled, shas = {}, {}, {}
        for key, device in devices.items():
            planned, plan = plan_model(graph, args.policy, device)
            _, sha, programs[key] = time_on_host(planned, plan, device, 1)
            modeled[key], shas[key] = plan.modeled_us, sha
        if shas["A"] == shas["B"]:
            print(f"| {name} | {modeled['A']:.0f} / {modeled['B']:.0f} | same C program | 1 |", flush=True)
            continue
        got = time_programs(programs, args.rounds, args.clock)
        ma, mb = statistics.median(got["A"]), statistics.median(got["B"])
        ratios.append(mb / ma)
        print(f"| {name} | {modeled['A']:.0f} / {modeled['B']:.0f} | {ma:.0f} / {mb:.0f} ({min(got['A']):.0f} / "
              f"{min(got['B']):.0f}) | {mb / ma:.3f} |", flush=True)
    if ratios:
        print(f"\nPrograms that differ: {len(ratios)}; B/A geometric mean "
              f"{statistics.geometric_mean(ratios):.3f}, worst {max(ratios):.3f}, best {min(ratios):.3f}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
