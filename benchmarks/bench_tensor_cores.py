"""Modeled effect of the TF32 tensor-core path (plan option tf32, engine/codegen/mma.py) on zoo models:
each model planned for a GPU preset with the option off and on, side by side in one run. Prints a table:
tiled GEMM phases, how many run on mma.sync, the modeled µs off -> on, and the sum over kernels of the
compute and shared-memory terms (what the tensor-core path changes; a kernel's time is its largest term
plus wave quantization and launch). Modeled, not measured (no GPU).

    PYTHONPATH=. python benchmarks/bench_tensor_cores.py [--device a100] [--models bert vit nerf]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from engine.codegen.generate import generate
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model

ZOO = Path(__file__).resolve().parents[1] / "samples" / "zoo"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="a100")
    ap.add_argument("--models", nargs="+", default=["bert", "vit", "nerf"])
    ap.add_argument("--policies", nargs="+", default=["unfused", "welder"])
    args = ap.parse_args()
    print("| model | policy | gemm phases | on mma.sync | kernels off / on | compute µs off → on | shared µs off → on "
          "| modeled µs off | modeled µs on | on / off |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        graph = load_graph(ZOO / f"{name}.onnx")
        for policy in args.policies:
            row = []
            for tf32 in (False, True):
                t = time.perf_counter()
                g, plan = plan_model(graph, policy, args.device, options={"tf32": True} if tf32 else {})
                program = generate(plan, g, args.device)
                gemms = [x for k in program.kernels for x in k.gemms]
                row.append((plan, len(gemms), sum(1 for x in gemms if x.mma), time.perf_counter() - t))
            (off, n_off, _, _), (on, n_on, mma, _) = row
            compute, shared = (" → ".join(f"{_term(p, t):.1f}" for p in (off, on)) for t in ("compute", "shared"))
            print(f"| {name} | {policy} | {n_on} | {mma} | {off.kernels} / {on.kernels} | {compute} | {shared} | "
                  f"{off.modeled_us:.1f} | {on.modeled_us:.1f} | {on.modeled_us / off.modeled_us:.2f} |", flush=True)


def _term(plan, term: str) -> float:
    return sum(g.cost.terms_us.get(term, 0.0) for g in plan.groups if g.cost is not None)


if __name__ == "__main__":
    main()
