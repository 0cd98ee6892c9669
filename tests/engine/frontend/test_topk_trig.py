"""The inverse and hyperbolic trigonometric functions (Tan, Asin, ..., Atanh: IR unary ops printed as libm calls):
random cases against onnxruntime on the reference executor, the C backend and the CUDA printer under the SIMT
emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import graph_model, max_rel_error, ort_outputs  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402

# op: the range its random inputs are drawn from (inside the function's domain)
TRIG = {"Tan": (-1.4, 1.4), "Asin": (-0.999, 0.999), "Acos": (-0.999, 0.999), "Atan": (-20.0, 20.0),
        "Sinh": (-5.0, 5.0), "Cosh": (-5.0, 5.0), "Asinh": (-50.0, 50.0), "Acosh": (1.0, 50.0),
        "Atanh": (-0.99, 0.99)}


@pytest.mark.parametrize("op", sorted(TRIG))
def test_trigonometric_ops_match_onnxruntime_on_every_executor(tmp_path, op):
    x = np.random.default_rng(len(op)).uniform(*TRIG[op], (5, 37)).astype(np.float32)
    # Mul by 1 after: the function is a fused kernel's inner value, not only a lone stage's.
    model = graph_model([helper.make_node(op, ["x"], ["t"]), helper.make_node("Mul", ["t", "one"], ["y"])],
                        {"x": x}, {"one": np.ones((37,), np.float32)}, opset=17)
    onnx.save(model, tmp_path / "t.onnx")
    want = ort_outputs(model, {"x": x})[0]
    assert max_rel_error(run_reference(lower(import_onnx(model)), {"x": x})["y"], want) < 1e-6
    assert max_rel_error(run_model(load_graph(tmp_path / "t.onnx"), {"x": x}, backend="cpu",
                                   policy="welder").outputs["y"], want) < 1e-6
    result = run_model(load_graph(tmp_path / "t.onnx"), {"x": x}, backend="cuda-sim", policy="welder")
    assert max_rel_error(result.outputs["y"], want) < 1e-6
    assert not result.sim.findings, result.sim.findings
