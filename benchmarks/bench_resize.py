"""Resize on the host, as one stage summing every combination of taps against one stage per axis
(`engine.frontend.ops.resize.SEPARABLE`): each case a one-node ONNX model lowered both ways, planned for `host`
under each policy, printed as C, compiled and timed in the same process, interleaved (median over rounds of each
program's kernels, each the median of --repeat launches), beside the modeled time; outputs checked against
onnxruntime (benchmarks/NOTES.md "separableresize").

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_resize.py [CASE ...] [--rounds 11] [--repeat 51]

CASE is c,h,w,factor,mode,coordinate_mode (default: unet's 24,32,32,2,linear,align_corners and two more).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT = ["24,32,32,2,linear,align_corners", "32,28,28,2,linear,half_pixel", "16,20,20,2,cubic,half_pixel"]


def resize_model(c: int, h: int, w: int, factor: int, mode: str, coord: str):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coord)
    graph = helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
         numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")])
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)],
                                                               ir_version=9))


def main(argv=None) -> int:
    import onnxruntime as ort

    from engine.codegen.ccompile import compile_c, load_library
    from engine.codegen.generate import generate
    from engine.codegen.targets import render_c
    from engine.device import get_device
    from engine.frontend.importer import import_onnx, lower
    from engine.frontend.ops import resize
    from engine.runtime.cpu import CpuModule, run_cpu
    from engine.schedule.pipeline import plan_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--repeat", type=int, default=51)
    ap.add_argument("--policies", default="unfused,welder")
    args = ap.parse_args(argv)
    dev = get_device("host")
    print("| case | policy | form | kernels | measured µs | modeled µs | separable / one stage | max abs err vs ort |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for case in args.cases:
        c, h, w, factor, mode, coord = case.split(",")
        model = resize_model(int(c), int(h), int(w), int(factor), mode, coord)
        x = np.random.default_rng(0).standard_normal((1, int(c), int(h), int(w))).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        mods = {}
        for form, separable in (("one stage", False), ("separable", True)):
            resize.SEPARABLE = separable
            try:
                graph = lower(import_onnx(model))
            finally:
                resize.SEPARABLE = True
            for policy in args.policies.split(","):
                planned, plan = plan_model(graph, policy, dev)
                program = generate(plan, planned, dev, target="c")
                source = render_c(program)
                lib = load_library(compile_c(source, name=f"bench_resize_{policy}_{separable}"))
                mods[(policy, form)] = (CpuModule(program, source, lib, ""), planned, plan)
        times = {k: [] for k in mods}
        errs = {}
        keys = list(mods)
        for r in range(args.rounds):
            for k in (keys if r % 2 == 0 else keys[::-1]):
                mod, planned, _ = mods[k]
                outs, prof = run_cpu(mod, planned.specs, {"x": x}, planned.weights, repeat=args.repeat)
                times[k].append(sum(kk.us for kk in prof.kernels))
                errs[k] = float(np.max(np.abs(outs["y"] - want)))
        for policy, form in keys:
            mod, _, plan = mods[(policy, form)]
            med = statistics.median(times[(policy, form)])
            ratio = med / statistics.median(times[(policy, "one stage")])
            modeled = sum(g.cost.modeled_us for g in plan.groups if g.cost)
            print(f"| {case} | {policy} | {form} | {len(plan.groups)} | {med:.1f} | {modeled:.1f} | {ratio:.2f} | "
                  f"{errs[(policy, form)]:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
