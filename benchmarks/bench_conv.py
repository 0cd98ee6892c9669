"""One convolution at a time on the host: each case a one-node ONNX model, planned unfused for `host`, printed as
C, compiled and timed (the kernel's median over --repeat launches, the best of --rounds), beside its modeled
time and its output checked against onnxruntime. What a conv of a given kind (dense or depthwise, taps, stride,
padding) costs against what the model says, apart from any fusion: the lead for codegen and cost-model work on
conv nets (benchmarks/NOTES.md "evenlanes").

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_conv.py [CASE ...] [--repeat 31] [--rounds 5]

CASE is cin,cout,hw,k,stride,group[,pad] (pad defaults to k // 2); none given: a default set of the zoo's kinds.
Run it with PYTHONPATH=<other checkout> to set a change beside the code before it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT = ["16,32,16,1,2,1,0", "64,128,16,1,2,1,0", "64,64,17,3,2,1,0", "16,16,33,3,2,1,0", "64,64,16,3,1,1",
           "64,64,16,3,2,1", "48,48,32,3,1,48", "48,48,32,3,2,48", "64,64,8,5,1,64"]


def case_of(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) not in (6, 7) or min(vals[:6]) < 1 or vals[0] % vals[5] or vals[1] % vals[5]:
        raise argparse.ArgumentTypeError(f"{text!r} is not cin,cout,hw,k,stride,group[,pad] (positive, the channels "
                                         "divisible by group), e.g. 64,64,16,3,2,1")
    return vals


def conv_model(cin: int, cout: int, hw: int, k: int, s: int, group: int, pad: int | None = None, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((cout, cin // group, k, k)).astype(np.float32)
    p = k // 2 if pad is None else pad
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, group=group)
    g = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", type=case_of)
    ap.add_argument("--repeat", type=int, default=31)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    import onnxruntime as ort

    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import import_onnx, lower
    from engine.runtime.cpu import compile_program_c, run_cpu
    from engine.runtime.inputs import make_inputs
    from engine.schedule.pipeline import plan_model

    device = get_device("host")
    print("| cin | cout | hw | k | stride | group | pad | modeled µs | measured µs | measured / modeled | max rel err |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in args.cases or [case_of(c) for c in DEFAULT]:
        model = conv_model(*case)
        graph, plan = plan_model(lower(import_onnx(model)), "unfused", device)
        module = compile_program_c(generate(plan, graph, device, target="c"))
        inputs = make_inputs(graph, seed=0)
        best = float("inf")
        for _ in range(args.rounds):
            outs, prof = run_cpu(module, graph.specs, inputs, graph.weights, repeat=args.repeat)
            best = min(best, sum(k.us for k in prof.kernels))
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": inputs["x"]})[0]
        err = float(np.max(np.abs(outs["y"] - ref)) / (np.max(np.abs(ref)) or 1.0))
        modeled = sum(g.cost.modeled_us for g in plan.groups if g.cost)
        pad = case[6] if len(case) > 6 else case[3] // 2
        print(f"| {' | '.join(map(str, case[:6]))} | {pad} | {modeled:.1f} | {best:.1f} | {best / modeled:.2f}x | {err:.1e} |")


if __name__ == "__main__":
    main()
