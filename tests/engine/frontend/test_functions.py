"""ONNX function ops without a converter (engine/frontend/functions.py) import as their function's body:
MeanVarianceNormalization, Swish, SwiGLU and the losses against onnxruntime or NumPy, on the reference
executor, on the C backend under every policy and under the SIMT emulator; the body's opset and its
attribute defaults; an op of a body that is not supported named in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, graph_model, max_rel_error, ort_outputs  # noqa: E402

from engine.api import supported_ops  # noqa: E402
from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.context import CONVERTERS  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, outs: dict, opset: int) -> onnx.ModelProto:
    return graph_model(nodes, inputs, consts, outs, opset)


def test_function_ops_are_claimed_beside_the_converted_ones():
    ops = set(supported_ops())
    assert {"MeanVarianceNormalization", "Swish", "SwiGLU", "SoftmaxCrossEntropyLoss"} <= ops - set(CONVERTERS)
    assert set(CONVERTERS) <= ops


@pytest.mark.parametrize("opset", [13, 18])  # the function's two bodies: ReduceMean's axes an attribute, an input
def test_mean_variance_normalization_matches_onnxruntime(opset):
    x = np.random.default_rng(opset).standard_normal((2, 3, 4, 5)).astype(np.float32) * 3 + 1
    model = _model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], {"x": x}, {},
                   {"y": TensorProto.FLOAT}, opset)
    want = ort_outputs(model, {"x": x})[0]
    assert max_rel_error(run_reference(lower(import_onnx(model)), {"x": x})["y"], want) < 1e-5


def _swish(x, alpha):
    return x / (1 + np.exp(-alpha * x))


@pytest.mark.parametrize("alpha", [None, 0.5])
def test_swish_and_swiglu_follow_their_definitions_with_the_attribute_default(alpha):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)
    attrs = {} if alpha is None else {"alpha": alpha}
    model = _model([helper.make_node("Swish", ["a"], ["s"], **attrs),
                    helper.make_node("SwiGLU", ["a", "b"], ["g"], **attrs)],
                   {"a": a, "b": b}, {}, {"s": TensorProto.FLOAT, "g": TensorProto.FLOAT}, 28)
    got = run_reference(lower(import_onnx(model)), {"a": a, "b": b})
    want = _swish(a, 1.0 if alpha is None else alpha)
    assert max_rel_error(got["s"], want) < 1e-6
    assert max_rel_error(got["g"], want * b) < 1e-6


def _loss(path: Path) -> Path:
    """A classifier's training loss as exported: logits from a projection, SoftmaxCrossEntropyLoss (a
    context-dependent function: its body depends on the reduction and on whether weights are given) against
    integer labels with an ignored index, plus the per-sample losses scaled."""
    rng = np.random.default_rng(3)
    consts = {"w": rng.standard_normal((6, 5)).astype(np.float32), "cw": rng.random(5).astype(np.float32) + 0.5,
              "half": np.asarray(0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels", "cw"], ["loss"], reduction="mean",
                              ignore_index=2),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["each"], reduction="none"),
             helper.make_node("Mul", ["each", "half"], ["y"])]
    x, labels = np.zeros((8, 6), np.float32), np.zeros(8, np.int64)
    model = _model(nodes, {"x": x, "labels": labels}, consts, {"loss": TensorProto.FLOAT, "y": TensorProto.FLOAT}, 13)
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return path


def _loss_feeds() -> dict:
    rng = np.random.default_rng(4)
    return {"x": rng.standard_normal((8, 6)).astype(np.float32), "labels": rng.integers(0, 5, 8).astype(np.int64)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_a_loss_imports_as_its_body_and_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_loss(tmp_path / "loss.onnx"), _loss_feeds(), policy=policy)


def test_a_loss_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_loss(tmp_path / "loss.onnx"), _loss_feeds(), backend="cuda-sim")


def test_the_graph_keeps_the_models_op_names():
    x = np.ones((1, 2, 3, 3), np.float32)
    graph = import_onnx(_model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], {"x": x}, {},
                               {"y": TensorProto.FLOAT}, 18))
    assert graph.onnx_ops == {"MeanVarianceNormalization": 1}
    assert {n.op_type for n in graph.nodes} <= set(CONVERTERS)
    assert all(n.name.startswith("MeanVarianceNormalization_0/") for n in graph.nodes)


def test_an_op_of_a_body_that_is_not_supported_is_named_in_one_line():
    x = np.full((3, 4), 0.5, np.float32)
    model = _model([helper.make_node("Bernoulli", ["x"], ["y"])], {"x": x}, {}, {"y": TensorProto.FLOAT}, 22)
    with pytest.raises(UnsupportedOpError, match="op RandomUniformLike .* in the body of ONNX function Bernoulli") \
            as err:
        import_onnx(model)
    assert "\n" not in str(err.value)
