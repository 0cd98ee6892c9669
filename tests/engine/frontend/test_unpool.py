"""LpPool and GlobalLpPool, MaxPool's Indices output and MaxUnpool (engine/frontend/ops/pool.py) against onnxruntime;
for the last two: ties (the first in scan
order), padding, strides, dilations, 3-D, column-major indices; MaxUnpool with and without output_shape (indices
flat over the output, as onnxruntime and PyTorch read them; the ONNX reference decodes them over the unpadded
size), searching only the covering windows where the indices are a MaxPool's of the same window; a SegNet-style
encoder-decoder on the C backend under every policy and under the SIMT emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, graph_model, ort_outputs  # noqa: E402

from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, outs: dict, opset: int = 22) -> onnx.ModelProto:
    return graph_model(nodes, inputs, consts, outs, opset)


POOLS = [((1, 2, 6, 7), {"kernel_shape": [2, 2], "strides": [2, 2]}),
         ((2, 3, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
         ((1, 2, 8, 8), {"kernel_shape": [2, 2], "dilations": [2, 2]}),
         ((1, 2, 5, 6), {"kernel_shape": [3, 2], "storage_order": 1}),
         ((1, 1, 4, 4, 5), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]})]


@pytest.mark.parametrize(("shape", "attrs"), POOLS)
def test_maxpool_indices_match_onnxruntime_with_ties(shape, attrs):
    x = np.random.default_rng(len(shape)).integers(-2, 3, shape).astype(np.float32)  # ties: the first wins
    model = _model([helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)], {"x": x}, {},
                   {"y": TensorProto.FLOAT, "i": TensorProto.INT64})
    got = run_reference(lower(import_onnx(model)), {"x": x})
    want = ort_outputs(model, {"x": x})
    np.testing.assert_array_equal(got["y"], want[0])
    np.testing.assert_array_equal(got["i"], want[1])


@pytest.mark.parametrize("output_shape", [None, [1, 2, 7, 9]])
def test_max_unpool_of_arbitrary_indices_matches_onnxruntime(output_shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    plane = 7 * 9 if output_shape else 6 * 8
    idx = np.stack([rng.permutation(plane)[:12] + c * plane for c in range(2)]).reshape(1, 2, 3, 4).astype(np.int64)
    ins, consts = ["x", "i"], {"i": idx}
    if output_shape:
        ins.append("shape")
        consts["shape"] = np.asarray(output_shape, np.int64)
    model = _model([helper.make_node("MaxUnpool", ins, ["y"], kernel_shape=[2, 2], strides=[2, 2])], {"x": x},
                   consts, {"y": TensorProto.FLOAT})
    np.testing.assert_array_equal(run_reference(lower(import_onnx(model)), {"x": x})["y"], ort_outputs(model, {"x": x})[0])


def _segnet(path: Path) -> Path:
    """SegNet's encoder-decoder step: a conv, a 2x2 max pool keeping its indices, a conv on the pooled map, and the
    unpool putting its values back where the maxima were, a conv after."""
    rng = np.random.default_rng(5)
    consts = {"w1": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
              "w2": (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32),
              "w3": (rng.standard_normal((2, 4, 3, 3)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r", ], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxUnpool", ["b", "i"], ["u"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["u", "w3"], ["y"], pads=[1, 1, 1, 1])]
    onnx.save(_model(nodes, {"x": np.zeros((1, 3, 8, 10), np.float32)}, consts, {"y": TensorProto.FLOAT}), path)
    return path


def _segnet_feeds() -> dict:
    return {"x": np.random.default_rng(6).standard_normal((1, 3, 8, 10)).astype(np.float32)}


def test_unpooling_a_maxpools_indices_searches_only_the_covering_windows(tmp_path):
    graph = lower(import_onnx(onnx.load(_segnet(tmp_path / "segnet.onnx"))))
    (match,) = [s for s in graph.stages if s.op == "maxunpool.match"]
    assert match.reduce == (1, 1)  # a 2x2 window at stride 2: one covering window per axis, not the 20-wide plane


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_segnet_step_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_segnet(tmp_path / "segnet.onnx"), _segnet_feeds(), policy=policy)


def test_segnet_step_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_segnet(tmp_path / "segnet.onnx"), _segnet_feeds(), backend="cuda-sim")



@pytest.mark.parametrize(("op", "attrs"), [
    ("LpPool", {"kernel_shape": [3, 3], "p": 1}), ("LpPool", {"kernel_shape": [2, 3], "strides": [2, 1], "p": 2}),
    ("LpPool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "p": 3}), ("GlobalLpPool", {"p": 2}),
    ("GlobalLpPool", {"p": 3})])
def test_lp_pools_match_onnxruntime(op, attrs):
    x = np.random.default_rng(7).standard_normal((2, 3, 6, 7)).astype(np.float32)
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, {}, {"y": TensorProto.FLOAT},
                   opset=18)  # onnxruntime has no GlobalLpPool at 22
    got = run_reference(lower(import_onnx(model)), {"x": x})["y"]
    want = ort_outputs(model, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def _lp_block(path: Path) -> Path:
    """A conv, an L2 pool over 2x2 windows, a global L3 pool: the pools' sums and roots fused behind the conv."""
    w = (np.random.default_rng(8).standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("LpPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2], p=2),
             helper.make_node("GlobalLpPool", ["p"], ["y"], p=3)]
    onnx.save(_model(nodes, {"x": np.zeros((1, 3, 8, 8), np.float32)}, {"w": w}, {"y": TensorProto.FLOAT}, opset=18),
              path)
    return path


@pytest.mark.parametrize("backend", ["cpu", "cuda-sim"])
def test_lp_pool_block_runs_on_the_c_backend_and_under_the_simt_emulator(tmp_path, backend):
    feeds = {"x": np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    assert_runs_like_onnxruntime(_lp_block(tmp_path / "lp.onnx"), feeds, backend=backend)
