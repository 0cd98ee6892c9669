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

`--bf16`: the same for bf16 (samples/zoo/bf16.py; mma.sync m16n8k16 .bf16 in the third column). onnxruntime's
CPU provider has few bf16 kernels, so `--sim` compares with onnxruntime on the fp32 model fed the same bf16
inputs (widened exactly) and with the fp32 model's stored outputs.

    PYTHONPATH=. python benchmarks/bench_tensor_cores.py [--device a100] [--models bert vit nerf]
    PYTHONPATH=. python benchmarks/bench_tensor_cores.py --fp16 --devices a100 h100 --models bert vit gpt2 nerf [--sim]
    PYTHONPATH=. python benchmarks/bench_tensor_cores.py --bf16 --devices a100 h100 --models bert vit nerf [--sim]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx

from engine.codegen.generate import generate
from engine.codegen.mma import MMA_BF16, MMA_F16, MMA_TF32
from engine.device import get_device
from engine.errors import ModelError
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model

ZOO = Path(__file__).resolve().parents[1] / "samples" / "zoo"
sys.path.insert(0, str(ZOO))
from bf16 import bf16_inputs, to_bf16  # noqa: E402
from fp16 import fp16_inputs, to_fp16  # noqa: E402

# Per 16-bit path: (converter, input cast, Gemm.mma of its tensor-core path).
PATHS = {"fp16": (to_fp16, fp16_inputs, MMA_F16), "bf16": (to_bf16, bf16_inputs, MMA_BF16)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="a100")
    ap.add_argument("--models", nargs="+", default=["bert", "vit", "nerf"])
    ap.add_argument("--policies", nargs="+", default=["unfused", "welder"])
    ap.add_argument("--fp16", action="store_true", help="the fp16 path: FMA vs TF32 vs m16n8k16 .f16 per device")
    ap.add_argument("--bf16", action="store_true", help="the bf16 path: FMA vs TF32 vs m16n8k16 .bf16 per device")
    ap.add_argument("--devices", nargs="+", default=["a100", "h100"], help="with --fp16 / --bf16")
    ap.add_argument("--sim", action="store_true", help="with --fp16 / --bf16: cuda-sim max error of the welder program")
    args = ap.parse_args()
    if args.fp16 and args.bf16:
        ap.error("--fp16 and --bf16: choose one")
    if args.fp16 or args.bf16:
        return bench_16(args, "bf16" if args.bf16 else "fp16")
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


def bench_16(args, kind: str) -> None:
    convert, _, mma_kind = PATHS[kind]
    t = {"fp16": "f16", "bf16": "bf16"}[kind]  # column labels
    tmp = Path(tempfile.mkdtemp(prefix=f"tw_{kind}_"))
    print(f"| model | device | policy | gemm phases | fma / tf32 / {t} mma | compute µs fma → tf32 → {t} "
          f"| modeled µs fma | modeled µs tf32 | modeled µs {t} | {t} / fma | {t} / tf32 |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    sims = []
    for name in args.models:
        path = tmp / f"{name}.{kind}.onnx"
        onnx.save(convert(onnx.load(ZOO / f"{name}.onnx")), path)
        try:
            graph = load_graph(path)
        except ModelError as err:  # e.g. nerf's Sin takes no bf16 in ONNX: the converter does not insert Casts
            print(f"| {name} | - | - | not a valid {kind} graph: {err} |", flush=True)
            continue
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
                print(f"| {name} | {dev} | {policy} | {n} | {k16['']} / {k16[MMA_TF32]} / {k16[mma_kind]} "
                      f"(tf32 plan: {k32[MMA_TF32]} tf32) | {compute} | {fma.modeled_us:.1f} | {tf32.modeled_us:.1f} | "
                      f"{f16.modeled_us:.1f} | {f16.modeled_us / fma.modeled_us:.2f} | {f16.modeled_us / tf32.modeled_us:.2f} |",
                      flush=True)
        if args.sim:
            sims.append(_sim_error(name, path, graph, args.devices[0], kind))
    if sims:
        ort_model = {"fp16": "onnxruntime fp16", "bf16": "onnxruntime fp32 model on the bf16 inputs"}[kind]
        print(f"\ncuda-sim, welder on {args.devices[0]}: max |error| / max |reference|\n")
        print(f"| model | {t} mma GEMMs / all | findings | vs {ort_model} | vs fp32 model (onnxruntime) "
              f"| {ort_model} vs fp32 | sim s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for row in sims:
            print("| " + " | ".join(row) + " |")


def _sim_error(name: str, path: Path, graph, device: str, kind: str = "fp16") -> list[str]:
    import onnxruntime as ort

    from engine.runtime.execute import run_model

    _, cast, mma_kind = PATHS[kind]
    data = np.load(ZOO / f"{name}.io.npz")
    inputs = cast({t.name: data[t.name] for t in graph.inputs})
    t = time.perf_counter()
    g, plan = plan_model(graph, "welder", device)
    result = run_model(g, inputs, backend="cuda-sim", plan=plan, device=device)
    seconds = time.perf_counter() - t
    if kind == "fp16":
        want16 = dict(zip(graph.output_names, ort.InferenceSession(str(path)).run(None, inputs)))
    else:  # few bf16 kernels in onnxruntime's CPU provider: the fp32 model on the bf16 inputs, widened exactly
        wide = {n: v.astype(np.float32) if v.dtype == ml_dtypes.bfloat16 else v for n, v in inputs.items()}
        want16 = dict(zip(graph.output_names, ort.InferenceSession(str(ZOO / f"{name}.onnx")).run(None, wide)))
    gemms = [x for k in result.program.kernels for x in k.gemms]

    def err(a, b) -> float:
        return max(float(np.abs(np.asarray(a[n], np.float32) - np.asarray(b[n], np.float32)).max()
                         / np.abs(np.asarray(b[n], np.float32)).max()) for n in graph.output_names)

    fp32 = {n: data[n] for n in graph.output_names}
    return [name, f"{sum(x.mma == mma_kind for x in gemms)} / {len(gemms)}", str(len(result.sim.findings)),
            f"{err(result.outputs, want16):.1e}", f"{err(result.outputs, fp32):.1e}", f"{err(want16, fp32):.1e}",
            f"{seconds:.0f}"]


def _term(plan, term: str) -> float:
    return sum(g.cost.terms_us.get(term, 0.0) for g in plan.groups if g.cost is not None)


if __name__ == "__main__":
    main()
