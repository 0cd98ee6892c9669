"""Whole rows per block beyond 8,192 elements (engine/schedule/tiles.py `candidate_tiles`): a segment that
reduces its rows and computes a row vector every row reads (a bias from the columns alone) gets tiles of more
rows, up to half the device's per-block memory, so its blocks amortise that vector; on host the welder plan
then runs such a graph in one pass (no grid barrier: the rows stay in the block) and matches numpy; a segment
whose row vector is a weight gets no such tiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.runtime.execute import run_model
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import Conn
from engine.schedule.tiles import candidate_tiles
from engine.tilegraph.tilegraph import segments_of

M, N = 64, 2048


def _model(path: Path, computed_bias: bool) -> Path:
    """out = y / rowsum(y), y = x + bias; bias = exp(-sqrt(|a| + 1)) of an input row `a` (computed_bias), else
    a constant row."""
    rng = np.random.default_rng(7)
    inits, nodes = [], []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, N])]
    if computed_bias:
        inputs.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, N]))
        inits.append(onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one"))
        nodes += [helper.make_node("Abs", ["a"], ["abs"]), helper.make_node("Add", ["abs", "one"], ["inc"]),
                  helper.make_node("Sqrt", ["inc"], ["root"]), helper.make_node("Neg", ["root"], ["neg"]),
                  helper.make_node("Exp", ["neg"], ["bias"])]
    else:
        inits.append(onnx.numpy_helper.from_array(rng.random((1, N)).astype(np.float32), "bias"))
    inits.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    nodes += [helper.make_node("Add", ["x", "bias"], ["y"]),
              helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=1),
              helper.make_node("Div", ["y", "s"], ["out"])]
    graph = helper.make_graph(nodes, "wide_rows", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [M, N])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)
    return path


def _widest(graph, device) -> int:
    """Elements of the largest candidate tile for the whole graph as one segment anchored at its output."""
    stages = [s.name for s in graph.stages]
    anchor = graph.outputs[0]
    return max(t.shape[-1] * t.shape[-2] for t in candidate_tiles(graph, stages, anchor, device, "welder"))


@pytest.mark.parametrize("device_name", ["a100", "h100"])
def test_a_computed_row_vector_gets_tiles_of_more_rows_within_half_the_block_memory(tmp_path, device_name):
    device = get_device(device_name)
    wide = load_graph(_model(tmp_path / "computed.onnx", computed_bias=True))
    assert _widest(wide, device) > 8192
    assert _widest(wide, device) * 4 <= device.max_smem_per_block_bytes // 2
    weight = load_graph(_model(tmp_path / "weight.onnx", computed_bias=False))
    assert _widest(weight, device) <= 8192


def test_the_host_plan_keeps_the_rows_in_the_block_and_matches_numpy(tmp_path):
    path = _model(tmp_path / "computed.onnx", computed_bias=True)
    graph = load_graph(path)
    _, plan = plan_model(graph, "welder", get_device("host"))
    conns = {e.key: e.conn for e in plan.edges}
    assert len(plan.groups) == 1 and Conn.GLOBAL_SYNC not in conns.values()
    assert len(segments_of(graph, list(plan.groups[0].stages), conns)) == 1
    assert plan.groups[0].segments[0].shape[-2] * N > 8192
    rng = np.random.default_rng(3)
    x, a = rng.random((M, N)).astype(np.float32) + 0.5, rng.standard_normal((1, N)).astype(np.float32)
    got = run_model(graph, {"x": x, "a": a}, backend="cpu", plan=plan).outputs["out"]
    y = x + np.exp(-np.sqrt(np.abs(a) + 1))
    np.testing.assert_allclose(got, y / y.sum(-1, keepdims=True), rtol=1e-5, atol=1e-9)
