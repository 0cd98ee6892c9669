"""What the kernel IR's count (engine/codegen/count.py) keeps for the host cost model: the flops of each
reduction loop under its innermost trip count, and the flops of each transcendental op."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from engine.api import load_graph
from engine.codegen.count import count_kernel
from engine.codegen.generate import generate
from engine.device import Device, get_device
from engine.schedule.pipeline import plan_model

A100 = get_device("a100")
HOST16 = Device.from_dict(A100.to_dict() | {"name": "cpu16", "kind": "cpu", "vector_lanes": 16})


def _row_sums(path, rows: int, cols: int, op: str = "Relu"):
    """y = ReduceSum(op(x), axis 1): a per-row reduction loop of `cols` trips over an elementwise op."""
    nodes = [helper.make_node(op, ["x"], ["t"]),
             helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "row_sums", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows])],
                              [helper.make_tensor("axes", TensorProto.INT64, [1], np.array([1], np.int64))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return load_graph(path)


def _work(graph, device):
    planned, plan = plan_model(graph, "elementwise", device)
    program = generate(plan, planned, device, target="c")
    total = None
    for k in program.kernels:
        w = count_kernel(k)
        if total is None:
            total = w
        else:
            total.add(w)
    return total


def test_reduction_flops_are_kept_under_their_innermost_trip_count(tmp_path):
    for cols in (3, 48):
        w = _work(_row_sums(tmp_path / f"s{cols}.onnx", 256, cols), HOST16)
        assert set(w.loop_flops) == {cols}
        # the add of each term (and the relu, where it is inlined into the sum), per element of x
        assert w.loop_flops[cols] in (256 * cols, 2 * 256 * cols)
        assert w.loop_flops[cols] <= w.flops


def test_transcendental_flops_are_kept_per_op(tmp_path):
    w = _work(_row_sums(tmp_path / "sin.onnx", 64, 5, op="Sin"), HOST16)
    assert w.op_flops == {"sin": 6 * 64 * 5}
    assert w.loop_flops in ({5: 64 * 5}, {5: 7 * 64 * 5})  # the sin inside the row loop when inlined
