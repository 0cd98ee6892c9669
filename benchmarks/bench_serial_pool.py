"""Kernels the C target runs serially, timed as printed and on the thread pool: per model and policy, the plan
for `host` made once, each kernel with a serial segment (`GroupCost.serial_segments`: under
`ctarget.SERIAL_WORK` element-steps) timed as printed and then with the threshold lowered to --pooled-from
element-steps (its segments on the thread pool), the plan unchanged; modeled us beside both. The as-printed
side is the better of two passes (before and after the pooled one). Each time is the median of --runs launches
(`measure.time_compiled`, as `--tune` times kernels). Set OMP_NUM_THREADS to the threads the host device was
probed with.

    .venv/bin/python benchmarks/bench_serial_pool.py samples/zoo/swin.onnx:welder samples/zoo/mobilevit.onnx:stitch
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kernel_times(planned, plan, device, runs: int) -> dict[str, float]:
    """Kernel name -> median µs of `runs` launches of the plan's compiled C program (`measure.time_compiled`)."""
    from engine.schedule.measure import compile_variant, time_compiled

    return time_compiled(planned, compile_variant(planned, plan, device), device, repeat=max(1, runs))


def rows(spec: str, runs: int, pooled_from: int) -> list[tuple]:
    """(model, policy, kernel, modeled µs, as printed µs, pooled µs) for each serial kernel of `spec`
    ("MODEL.onnx:POLICY")."""
    import engine.codegen.ctarget as ctarget
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    model, policy = spec.rsplit(":", 1)
    device = get_device("host")
    planned, plan = plan_model(load_graph(model), policy, device)
    serial = {g.name: g.cost.modeled_us for g in plan.groups if g.cost and g.cost.serial_segments}
    threshold = ctarget.SERIAL_WORK
    before = kernel_times(planned, plan, device, runs)
    try:
        ctarget.SERIAL_WORK = pooled_from
        pooled = kernel_times(planned, plan, device, runs)
    finally:
        ctarget.SERIAL_WORK = threshold
    after = kernel_times(planned, plan, device, runs)
    return [(Path(model).stem, policy, k, serial[k], min(before[k], after[k]), pooled[k]) for k in before if k in serial]


def spec_ok(text: str) -> str:
    model, _, policy = text.rpartition(":")
    if not model or not policy:
        raise argparse.ArgumentTypeError(f"{text!r}: give MODEL.onnx:POLICY, e.g. samples/zoo/swin.onnx:welder")
    if not Path(model).is_file():
        raise argparse.ArgumentTypeError(f"{model!r} is not a file: give the path of an ONNX model")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("specs", nargs="+", type=spec_ok, metavar="MODEL.onnx:POLICY")
    p.add_argument("--runs", type=int, default=41, help="timed launches per kernel and side (default 41)")
    p.add_argument("--pooled-from", type=int, default=1 << 12,
                   help="serial threshold of the pooled side, element-steps (default 4096)")
    p.add_argument("--min-modeled", type=float, default=0.0, help="print only kernels modeled at this many us or more")
    args = p.parse_args(argv)
    print("| model | policy | kernel | modeled us | as printed us | pooled us | printed ÷ pooled |")
    print("|---|---|---|---:|---:|---:|---:|")
    for spec in args.specs:
        for model, policy, kernel, modeled, printed, pooled in rows(spec, args.runs, args.pooled_from):
            if modeled >= args.min_modeled:
                print(f"| {model} | {policy} | {kernel} | {modeled:.1f} | {printed:.1f} | {pooled:.1f} | "
                      f"{printed / pooled:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
