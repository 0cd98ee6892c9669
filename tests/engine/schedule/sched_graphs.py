"""Small ONNX graphs for scheduler tests (random weights, fixed seeds)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def attention_model(m: int = 16, k: int = 32, n: int = 24, seed: int = 0) -> onnx.ModelProto:
    """x[m,k] @ w[k,n] + b -> Softmax(-1) -> * scale: matmul, add, max, exp, sum, div, mul stages."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((n,)).astype(np.float32), "b")
    s = numpy_helper.from_array(rng.standard_normal((n,)).astype(np.float32) + 2, "s")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b"], ["add"], name="add"),
        helper.make_node("Softmax", ["add"], ["sm"], name="sm", axis=-1),
        helper.make_node("Mul", ["sm", "s"], ["out"], name="mul"),
    ]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [m, n])], [w, b, s])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gemv_chain_model(k: int = 128, n1: int = 256, n2: int = 512, seed: int = 2) -> onnx.ModelProto:
    """x[1,k] @ w1[k,n1] -> Relu -> @ w2[n1,n2]: two matrix-vector products ("a", "y") with a ReLU ("t")
    between them, the shape of one recurrence step's GEMV and gates (lstm's is 128 x 512)."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((k, n1)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((n1, n2)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="a"), helper.make_node("Relu", ["a"], ["t"], name="t"),
             helper.make_node("MatMul", ["t", "w2"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "gemvs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n2])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def qkv_model(m: int = 16, k: int = 32, n: int = 24, seed: int = 1) -> onnx.ModelProto:
    """Q/K/V-style projections of one input (operator batching joins them): q = x@wq, k = x@wk,
    v = x@wv, out = Relu(q * k + v)."""
    rng = np.random.default_rng(seed)
    ws = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), f"w{c}") for c in "qkv"]
    nodes = [helper.make_node("MatMul", ["x", f"w{c}"], [c], name=c) for c in "qkv"]
    nodes += [
        helper.make_node("Mul", ["q", "k"], ["qk"], name="qk"),
        helper.make_node("Add", ["qk", "v"], ["sum"], name="sum"),
        helper.make_node("Relu", ["sum"], ["out"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [m, n])], ws)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pool_model(seed: int = 3) -> onnx.ModelProto:
    """x -> Conv(3x3, pad 1) -> Relu -> MaxPool(3x3, stride 2, pad 1): a padded max pool, whose border tiles
    load fewer elements than its typical tile (zoo resnet's stem)."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def candidate_trials(graph, plan, device, limit: int | None = None):
    """Every candidate tile (the first `limit`) of every segment of `plan`'s kernels, the group's other
    segments at their chosen tiles: (group, its segments, the segment, its candidate tile, the trial tiles)."""
    from engine.schedule import tiles
    from engine.tilegraph.tilegraph import segment_sinks, segments_of

    conns = {e.key: e.conn for e in plan.edges}
    for group in plan.groups:
        segs = segments_of(graph, group.stages, conns)
        for j, seg in enumerate(segs):
            anchor = segment_sinks(graph, seg, conns)[-1]
            for tile in tiles.candidate_tiles(graph, seg, anchor, device, plan.policy)[:limit]:
                trial = list(group.segments)
                trial[j] = tile
                yield group, segs, seg, tile, trial
