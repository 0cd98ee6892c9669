"""GridSample (engine/frontend/ops/grid_sample.py): every mode, padding and align_corners against onnxruntime with
grids reaching past the borders, 2-D and 3-D; a flow-warping block (a conv predicting offsets, the grid they move,
the input sampled there) on the C backend under every policy and under the SIMT emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, max_rel_error, ort_outputs  # noqa: E402

from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, opset: int = 20) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape)
                                       for n, v in inputs.items()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9))


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_2d_matches_onnxruntime(mode, padding, align):
    rng = np.random.default_rng(hash((mode, padding, align)) % 1000)
    feeds = {"x": rng.standard_normal((2, 3, 5, 7)).astype(np.float32),
             "grid": rng.uniform(-1.6, 1.6, (2, 4, 6, 2)).astype(np.float32)}  # past the borders too
    model = _model([helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding,
                                     align_corners=align)], feeds, {})
    got = run_reference(lower(import_onnx(model)), feeds)["y"]
    assert max_rel_error(got, ort_outputs(model, feeds)[0]) < 1e-5


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_3d_matches_onnxruntime(mode, padding):
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((1, 2, 4, 5, 3)).astype(np.float32),
             "grid": rng.uniform(-1.4, 1.4, (1, 3, 2, 4, 3)).astype(np.float32)}
    model = _model([helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding)], feeds, {})
    got = run_reference(lower(import_onnx(model)), feeds)["y"]
    assert max_rel_error(got, ort_outputs(model, feeds)[0]) < 1e-5


def test_opset_16_names_bilinear_and_bicubic():
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 2, 4, 4)).astype(np.float32),
             "grid": rng.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)}
    for mode in ("bilinear", "bicubic"):
        model = _model([helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode)], feeds, {}, opset=16)
        got = run_reference(lower(import_onnx(model)), feeds)["y"]
        assert max_rel_error(got, ort_outputs(model, feeds)[0]) < 1e-5


def _warp(path: Path) -> Path:
    """Flow warping as optical-flow and deformable models do it: a 3x3 conv predicts a 2-channel offset field,
    tanh bounds it, added to the identity grid it moves each output's sampling point; the input is sampled
    bilinearly there (zeros outside)."""
    rng = np.random.default_rng(5)
    h, w = 6, 8
    ys, xs = np.meshgrid(np.linspace(-1, 1, h), np.linspace(-1, 1, w), indexing="ij")
    consts = {"wf": (rng.standard_normal((2, 3, 3, 3)) * 0.3).astype(np.float32),
              "base": np.stack([xs, ys], axis=-1)[None].astype(np.float32), "perm_scale": np.asarray(0.3, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "wf"], ["flow"], pads=[1, 1, 1, 1]), helper.make_node("Tanh", ["flow"], ["t"]),
             helper.make_node("Transpose", ["t"], ["tt"], perm=[0, 2, 3, 1]),
             helper.make_node("Mul", ["tt", "perm_scale"], ["off"]), helper.make_node("Add", ["base", "off"], ["grid"]),
             helper.make_node("GridSample", ["x", "grid"], ["y"], align_corners=1)]
    onnx.save(_model(nodes, {"x": np.zeros((1, 3, h, w), np.float32)}, consts), path)
    return path


def _warp_feeds() -> dict:
    return {"x": np.random.default_rng(6).standard_normal((1, 3, 6, 8)).astype(np.float32)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_flow_warping_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_warp(tmp_path / "warp.onnx"), _warp_feeds(), policy=policy)


def test_flow_warping_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_warp(tmp_path / "warp.onnx"), _warp_feeds(), backend="cuda-sim")


def test_a_grid_of_the_wrong_shape_is_refused_in_one_line():
    model = _model([helper.make_node("GridSample", ["x", "grid"], ["y"])],
                   {"x": np.zeros((1, 2, 4, 4), np.float32), "grid": np.zeros((1, 3, 3, 3), np.float32)}, {})
    with pytest.raises(UnsupportedOpError, match=r"sampled by a grid \[1, 3, 3, 3\]") as err:
        lower(import_onnx(model))
    assert "\n" not in str(err.value)
