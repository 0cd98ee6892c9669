"""Modeled effect of the tensor-core paths (engine/codegen/mma.py) on zoo models. Default: the TF32 path,
each model planned for a GPU preset with the plan option tf32 off and on, side by side in one run. Prints a
table: tiled GEMM phases, how many run on mma.sync, the modeled µs off -> on, and the sum over kernels of
the compute and shared-memory terms (what the tensor-core path changes; a kernel's time is its largest term
plus wave quantization and launch). Modeled, not measured (no GPU).

`--fp16`: the fp16 path instead. Each model converted to fp16 with onnx itself (samples/zoo/fp16.py) and
planned per device three ways in one run: the preset without tensor cores (every GEMM on the FMA micro-tile),
with TF32 ones only (fp16 loads on m16n8k8 .tf32, exact: the path before m16n8k16 .f16) and as it is (fp16
factors on m16n8k16 .f16). `--sim` adds the welder program's cuda-sim run on the preset (the real launch
configuration): findings and the max error against onnxruntime on the same fp16 model and against the fp32
model's outputs, relative to the largest output.

    PYTHONPATH=. python benchmarks/bench_tensor_cores.py [--device a100] [--models bert vit nerf]
    PYTHONPATH=. python benchmarks/bench_tensor_cores.py --fp16 --devices a100 h100 --models bert vit gpt2 nerf [--sim]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from engine.codegen.generate import generate
from engine.codegen.mma import MMA_F16, MMA_TF32
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model

ZOO = Path(__file__).resolve().parents[1] / "samples" / "zoo"
sys.path.insert(0, str(ZOO))
from fp16 import fp16_inputs, to_fp16  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="a100")
    ap.add_argument("--models", nargs="+", default=["bert", "vit", "nerf"])
    ap.add_argument("--policies", nargs="+", default=["unfused", "welder"])
    ap.add_argument("--fp16", action="store_true", help="the fp16 path: FMA vs TF32 vs m16n8k16 .f16 per device")
    ap.add_argument("--devices", nargs="+", default=["a100", "h100"], help="with --fp16")
    ap.add_argument("--sim", action="store_true", help="with --fp16: cuda-sim max error of the welder program")
    args = ap.parse_args()
    if args.fp16:
        return bench_fp16(args)
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


def bench_fp16(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tw_fp16_"))
    print("| model | device | policy | gemm phases | fma / tf32 / f16 mma | compute µs fma → tf32 → f16 "
          "| modeled µs fma | modeled µs tf32 | modeled µs f16 | f16 / fma | f16 / tf32 |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    sims = []
    for name in args.models:
        path = tmp / f"{name}.fp16.onnx"
        onnx.save(to_fp16(onnx.load(ZOO / f"{name}.onnx")), path)
        graph = load_graph(path)
        for dev in args.devices:
            preset = get_device(dev)
            variants = (dataclasses.replace(preset, name=f"{dev}-fma", tensor_precisions=(), peak_tf32_tensor_flops=0.0),
                        dataclasses.replace(preset, name=f"{dev}-tf32", tensor_precisions=("tf32",)), preset)
            for policy in args.policies:
                plans = []
                for device in variants:
                    g, plan = plan_model(graph, policy, device)
                    kinds = collections.Counter(x.mma for k in generate(plan, g, device).kernels for x in k.gemms)
                    plans.append((plan, kinds))
                (fma, _), (tf32, k32), (f16, k16) = plans
                n = sum(k16.values())
                compute = " → ".join(f"{_term(p, 'compute'):.1f}" for p, _ in plans)
                print(f"| {name} | {dev} | {policy} | {n} | {k16['']} / {k16[MMA_TF32]} / {k16[MMA_F16]} "
                      f"(tf32 plan: {k32[MMA_TF32]} tf32) | {compute} | {fma.modeled_us:.1f} | {tf32.modeled_us:.1f} | "
                      f"{f16.modeled_us:.1f} | {f16.modeled_us / fma.modeled_us:.2f} | {f16.modeled_us / tf32.modeled_us:.2f} |",
                      flush=True)
        if args.sim:
            sims.append(_sim_error(name, path, graph, args.devices[0]))
    if sims:
        print(f"\ncuda-sim, welder on {args.devices[0]}: max |error| / max |reference|\n")
        print("| model | f16 mma GEMMs / all | findings | vs onnxruntime fp16 | vs fp32 model (onnxruntime) | onnxruntime fp16 vs fp32 | sim s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for row in sims:
            print("| " + " | ".join(row) + " |")


def _sim_error(name: str, path: Path, graph, device: str) -> list[str]:
    import onnxruntime as ort

    from engine.runtime.execute import run_model

    data = np.load(ZOO / f"{name}.io.npz")
    inputs = fp16_inputs({t.name: data[t.name] for t in graph.inputs})
    t = time.perf_counter()
    g, plan = plan_model(graph, "welder", device)
    result = run_model(g, inputs, backend="cuda-sim", plan=plan, device=device)
    seconds = time.perf_counter() - t
    want16 = dict(zip(graph.output_names, ort.InferenceSession(str(path)).run(None, inputs)))
    gemms = [x for k in result.program.kernels for x in k.gemms]

    def err(a, b) -> float:
        return max(float(np.abs(np.asarray(a[n], np.float32) - np.asarray(b[n], np.float32)).max()
                         / np.abs(np.asarray(b[n], np.float32)).max()) for n in graph.output_names)

    fp32 = {n: data[n] for n in graph.output_names}
    return [name, f"{sum(x.mma == MMA_F16 for x in gemms)} / {len(gemms)}", str(len(result.sim.findings)),
            f"{err(result.outputs, want16):.1e}", f"{err(result.outputs, fp32):.1e}", f"{err(want16, fp32):.1e}",
            f"{seconds:.0f}"]


def _term(plan, term: str) -> float:
    return sum(g.cost.terms_us.get(term, 0.0) for g in plan.groups if g.cost is not None)


if __name__ == "__main__":
    main()
