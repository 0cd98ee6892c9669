"""Correctness of the tile space beyond powers of two on real models: per zoo model, device and policy,
the plan's tiles outside the old space (a non-power-of-two extent short of its axis, or a k step other
than the default: engine/schedule/tiles.py `_extents`, `reduce_steps`) are listed and the model is run
on `--backend` with that plan against the stored onnxruntime outputs (samples/zoo/NAME.io.npz); max
relative error printed per row. `--force-new`: each one-segment kernel whose candidate pool holds such
tiles runs the best-modeled of them that validate accepts instead of its chosen tile (so the new tiles'
printed code runs where the model did not pick them).

    PYTHONPATH=. .venv/bin/python benchmarks/check_tile_space.py --models vit,swin --devices host \
        [--policies welder,stitch] [--backend cpu|cuda-sim] [--force-new]"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from engine.device import get_device
from engine.errors import TileweaveError
from engine.frontend.importer import load_graph
from engine.runtime.execute import run_model
from engine.schedule.cost import estimate_group
from engine.schedule.pipeline import plan_model
from engine.schedule.tiles import candidate_tiles
from engine.schedule.validate import check_group
from engine.tilegraph.tilegraph import segment_sinks, segments_of

ZOO = Path(__file__).resolve().parents[1] / "samples" / "zoo"


def is_new(stage, t) -> bool:
    """A tile outside the power-of-two space with default k steps."""
    odd = [x for x, n in zip(t.shape, stage.shape) if x & (x - 1) and x != n]
    default = tuple(min(32, r) for r in stage.reduce) if stage.kind.value == "contraction" else ()
    return bool(odd) or t.reduce_step != default


def new_tiles(graph, plan) -> list[str]:
    return [f"{g.name}:{list(t.shape)}/k{list(t.reduce_step)}" for g in plan.groups for t in g.segments
            if is_new(graph.stage(t.stage), t)]


def force_new(graph, plan, device):
    """`plan` with each one-segment group at its best-modeled valid new candidate, where it has one."""
    conns = {e.key: e.conn for e in plan.edges}
    groups = []
    for g in plan.groups:
        segs = segments_of(graph, g.stages, conns)
        if len(segs) == 1 and not is_new(graph.stage(g.segments[0].stage), g.segments[0]):
            anchor = segment_sinks(graph, segs[0], conns)[-1]
            pool = [t for t in candidate_tiles(graph, segs[0], anchor, device, plan.policy)
                    if is_new(graph.stage(anchor), t) and not check_group(graph, g.stages, conns, [t], device, segs=segs)]
            if pool:
                best = min(pool, key=lambda t: estimate_group(graph, g.stages, conns, [t], device, segs=segs).modeled_us)
                g = dataclasses.replace(g, segments=(best,))
        groups.append(g)
    return dataclasses.replace(plan, groups=tuple(groups))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="vit,swin,mobilevit,bert,gpt2,convnext,efficientnet")
    parser.add_argument("--devices", default="host")
    parser.add_argument("--policies", default="welder,stitch")
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda-sim"))
    parser.add_argument("--force-new", action="store_true", help="run the best new candidate of each kernel")
    args = parser.parse_args()
    print("| model | device | policy | backend | new tiles | max rel error | run s |")
    print("|---|---|---|---|---:|---:|---:|")
    worst = 0.0
    for name in args.models.split(","):
        try:
            base = load_graph(ZOO / f"{name}.onnx")
            data = np.load(ZOO / f"{name}.io.npz")
        except (TileweaveError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        for dev in args.devices.split(","):
            for policy in args.policies.split(","):
                graph, plan = plan_model(base, policy, get_device(dev))
                if args.force_new:
                    plan = force_new(graph, plan, get_device(dev))
                found = new_tiles(graph, plan)
                t0 = time.perf_counter()
                result = run_model(graph, {t.name: data[t.name] for t in base.inputs}, backend=args.backend, plan=plan,
                                   device=dev)
                err = 0.0
                for out in base.output_names:
                    want = data[out].astype(np.float64)
                    err = max(err, float(np.abs(result.outputs[out] - want).max() / max(np.abs(want).max(), 1e-30)))
                worst = max(worst, err)
                print(f"| {name} | {dev} | {policy} | {args.backend} | {len(found)} | {err:.2e} | "
                      f"{time.perf_counter() - t0:.1f} |", flush=True)
                for f in found:
                    print(f"|  |  |  |  | {f} |  |  |")
    print(f"\nworst max rel error {worst:.2e}")


if __name__ == "__main__":
    main()
