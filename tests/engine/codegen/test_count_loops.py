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


def _conv_silu(path, hw: int, c: int = 32):
    """z = y * sigmoid(y), y = a 1x1 conv of x (random weights) over an hw x hw map."""
    rng = np.random.default_rng(hw)
    w = helper.make_tensor("w", TensorProto.FLOAT, [c, c, 1, 1], rng.standard_normal(c * c).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Sigmoid", ["y"], ["s"]),
             helper.make_node("Mul", ["y", "s"], ["z"])]
    graph = helper.make_graph(nodes, "conv_silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, c, hw, hw])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return load_graph(path)


def test_per_element_flops_are_kept_under_their_rows_trip_count(tmp_path):
    """The SiLU after a conv runs along the map's rows (the C target's vector loop): its flops are filed
    under the row's length, 2 on a 2x2 map, 16 on a 16x16 one — the conv's own multiply-adds are not."""
    for hw in (2, 16):
        graph = _conv_silu(tmp_path / f"c{hw}.onnx", hw)
        for policy in ("elementwise", "welder"):
            planned, plan = plan_model(graph, policy, HOST16)
            total = None
            for k in generate(plan, planned, HOST16, target="c").kernels:
                w = count_kernel(k)
                total = w if total is None else (total.add(w) or total)
            assert set(total.row_flops) == {hw}, (policy, total.row_flops)
            silu = 32 * hw * hw  # elements of z; sigmoid and multiply: several flops each
            assert 2 * silu <= total.row_flops[hw] < total.flops - total.tiled_flops + 1, policy
