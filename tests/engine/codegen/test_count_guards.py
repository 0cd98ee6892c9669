"""Guarded values in the count (engine/codegen/count.py): a value behind a bounds guard, or a padded load,
counts at the share of the positions where it runs. Checked against the global bytes cuda-sim's threads
move in the printed CUDA: a concatenation of slices (swin's cyclic shift) loads one element per output,
not one per input of the concatenation; the same inside a reduction."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from engine.api import load_graph
from engine.runtime.execute import run_model


def _i64(name, values):
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], np.array(values, np.int64))


def _rolled(path, shape, shift: int, axis: int, reduce: bool):
    """y = concat(x[..., shift:], x[..., :shift]) along `axis` (then a mean over the last axis)."""
    nodes = [helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["a"]),
             helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c" if reduce else "y"], axis=axis)]
    if reduce:
        nodes.append(helper.make_node("ReduceMean", ["c", "rax"], ["y"], keepdims=1))
    inits = [_i64("s0", [shift]), _i64("e0", [shape[axis]]), _i64("s1", [0]), _i64("e1", [shift]),
             _i64("ax", [axis]), _i64("rax", [len(shape) - 1])]
    graph = helper.make_graph(nodes, "roll", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])),
              path)
    return load_graph(path)


@pytest.mark.parametrize("shape,shift,axis,reduce", [
    ((1, 16, 8, 32), 3, 1, False),
    ((1, 12, 10, 24), 5, 2, False),
    ((1, 16, 96), 40, 2, True),
    ((2, 33, 40), 7, 1, True),
])
def test_a_concat_of_slices_is_counted_as_the_loads_it_makes(tmp_path, shape, shift, axis, reduce):
    graph = _rolled(tmp_path / "r.onnx", shape, shift, axis, reduce)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    for policy in ("unfused", "stitch"):
        result = run_model(graph, {"x": x}, backend="cuda-sim", policy=policy, device="a100")
        assert result.sim.ok, result.sim.summary_lines()
        want = np.roll(x, -shift, axis=axis)
        want = want.mean(axis=-1, keepdims=True) if reduce else want
        np.testing.assert_allclose(result.outputs["y"], want, rtol=1e-5, atol=1e-6)
        for k in result.sim.kernels:
            assert k.global_bytes == pytest.approx(k.modeled["l2"], rel=0.02), (policy, k.kernel)
