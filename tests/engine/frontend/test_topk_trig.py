"""TopK (engine/frontend/ops/reduce.py: ranks, no sort) and the inverse and hyperbolic trigonometric functions
(Tan, Asin, ..., Atanh: IR unary ops printed as libm calls): random cases against onnxruntime on the reference
executor, the C backend under every policy and the CUDA printer under the SIMT emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, graph_model, max_rel_error, ort_outputs  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.errors import UnsupportedOpError  # noqa: E402
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


def _topk_model(shape, k: int, opset: int = 17, **attrs) -> onnx.ModelProto:
    node = helper.make_node("TopK", ["x", "k"] if opset >= 10 else ["x"], ["v", "i"],
                            **(attrs if opset >= 10 else {**attrs, "k": k}))
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("i", TensorProto.INT64, None)],
                          [numpy_helper.from_array(np.asarray([k], np.int64), "k")] if opset >= 10 else [])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9))


# shape, k, attributes: the last axis, an inner one, the first, k = n, smallest first
TOPK = [((3, 10), 4, {}), ((2, 7, 5), 3, {"axis": 1}), ((6, 4), 2, {"axis": 0}), ((2, 9), 9, {}),
        ((4, 12), 5, {"largest": 0}), ((3, 8), 3, {"sorted": 0})]


@pytest.mark.parametrize(("shape", "k", "attrs"), TOPK)
def test_topk_matches_onnxruntime_with_ties(shape, k, attrs):
    # Small integers: many ties, which ONNX orders by index (the lower first).
    x = np.random.default_rng(k).integers(-3, 4, shape).astype(np.float32)
    model = _topk_model(shape, k, **attrs)
    values, indices = ort_outputs(model, {"x": x})
    got = run_reference(lower(import_onnx(model)), {"x": x})
    if not attrs.get("sorted", 1):  # any order (onnxruntime's is a heap's): the same elements, ordered by index
        axis = attrs.get("axis", -1)
        order, want_order = np.argsort(got["i"], axis=axis), np.argsort(indices, axis=axis)
        got = {n: np.take_along_axis(got[n], order, axis) for n in ("v", "i")}
        values, indices = (np.take_along_axis(a, want_order, axis) for a in (values, indices))
    np.testing.assert_array_equal(got["v"], values)
    np.testing.assert_array_equal(got["i"], indices)


def test_topk_at_opset_1_takes_k_from_its_attribute():
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    got = run_reference(lower(import_onnx(_topk_model((3, 7), 2, opset=9))), {"x": x})
    np.testing.assert_array_equal(got["i"], np.argsort(-x, axis=1, kind="stable")[:, :2])
    np.testing.assert_array_equal(got["v"], -np.sort(-x, axis=1)[:, :2])


def _routing(path: Path) -> Path:
    """Mixture-of-experts routing as exporters write it: router logits, softmax, the top 2 experts' weights and
    indices, the weights renormalised and each token's expert mask gathered by the indices."""
    rng = np.random.default_rng(5)
    consts = {"w": rng.standard_normal((16, 8)).astype(np.float32), "k": np.asarray([2], np.int64),
              "table": rng.standard_normal((8, 3)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"]),
             helper.make_node("TopK", ["p", "k"], ["top", "experts"]),
             helper.make_node("ReduceSum", ["top"], ["total"], axes=[-1], keepdims=1, noop_with_empty_axes=0),
             helper.make_node("Div", ["top", "total"], ["weights"]),
             helper.make_node("Gather", ["table", "experts"], ["rows"]),
             helper.make_node("Unsqueeze", ["weights", "last"], ["w3"]),
             helper.make_node("Mul", ["rows", "w3"], ["y"])]
    consts["last"] = np.asarray([-1], np.int64)
    nodes[3] = helper.make_node("ReduceSum", ["top", "last"], ["total"], keepdims=1)
    model = graph_model(nodes, {"x": np.zeros((10, 16), np.float32)}, consts, opset=17)
    onnx.save(model, path)
    return path


def _routing_feeds() -> dict:
    return {"x": np.random.default_rng(7).standard_normal((10, 16)).astype(np.float32)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_moe_routing_plans_and_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_routing(tmp_path / "route.onnx"), _routing_feeds(), policy=policy)


def test_moe_routing_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_routing(tmp_path / "route.onnx"), _routing_feeds(), backend="cuda-sim")


@pytest.mark.parametrize(("k", "match"), [(7, "K=7 along an axis of 5"), (-1, "K=-1")])
def test_topk_with_k_out_of_range_is_refused_in_one_line(k, match):
    with pytest.raises(UnsupportedOpError, match=match) as err:
        lower(import_onnx(_topk_model((2, 5), k)))
    assert "\n" not in str(err.value)
