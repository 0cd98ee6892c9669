"""Tests for engine/frontend/importer.py: shape-subgraph folding, initializers as constants, --shape
binding of symbolic dims, opset handling, external data, and the errors for bad models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import EXTERNAL_W, external_data_model, run_ort, sample_path, tiny_model

from engine.errors import ModelError, ShapeError, UnsupportedOpError
from engine.frontend.importer import import_onnx, load_graph, lower
from engine.runtime.inputs import make_inputs
from engine.runtime.reference import run_reference


def _shape_subgraph(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes computing from Shape outputs (up to the Reshapes that consume them)."""
    derived, names = set(), set()
    for n in model.graph.node:
        if n.op_type == "Shape" or (n.op_type != "Reshape" and derived & set(n.input)):
            derived |= set(n.output)
            names.add(n.name)
    return names


def test_shape_subgraph_folds_away():
    model = onnx.load(str(sample_path("bert_layer")))
    shape_nodes = _shape_subgraph(model)
    assert len(shape_nodes) >= 4 + 8 + 4  # Shape, Gather, Unsqueeze..., Concat
    graph = import_onnx(sample_path("bert_layer"))
    assert graph.onnx_ops["Shape"] == 4 and graph.onnx_ops["Gather"] == 8  # histogram is pre-folding
    assert not {n.name for n in graph.nodes} & shape_nodes
    assert not [n.op_type for n in graph.nodes if n.op_type in ("Shape", "Gather", "Concat")]
    assert [n.op_type for n in graph.nodes].count("Reshape") == 4  # the reshapes stay, with folded shapes
    pg = lower(graph)
    assert not [s.name for s in pg.stages if set(s.origin) & shape_nodes]
    assert not [s.name for s in pg.stages if s.op == "gather"]


def test_initializers_become_constants():
    path = sample_path("layernorm_residual")
    model = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    pg = load_graph(path)
    assert {t.name for t in pg.inputs}.isdisjoint(inits)
    big = {n: v for n, v in inits.items() if v.size > 1}  # scalars become immediates in the bodies
    assert big and set(big) <= set(pg.weights)
    for name, value in big.items():
        np.testing.assert_array_equal(pg.weights[name], value)
        assert pg.specs[name].shape == value.shape
    assert pg.param_bytes == sum(c.nbytes for c in pg.constants)


def test_fp16_weights_with_cast_fold_to_float32_constants():
    pg = load_graph(sample_path("bert_layer"))
    assert pg.constants and all(c.dtype.value == "float32" for c in pg.constants if len(c.shape) == 2)
    assert not [s for s in pg.stages if s.op == "cast" and all(t in pg.weights for t in s.inputs)]


def test_shape_binding_of_symbolic_dims(save_model):
    path = save_model(tiny_model("Relu", ("batch", 5)))
    pg = load_graph(path, {"x": (3, 5)})
    assert pg.inputs[0].shape == (3, 5) and pg.stages[-1].shape == (3, 5)
    with pytest.raises(ShapeError, match="axis 1 is fixed to 5"):
        import_onnx(path, {"x": (3, 4)})
    with pytest.raises(ShapeError, match="rank 3"):
        import_onnx(path, {"x": (3, 5, 1)})
    with pytest.raises(ShapeError, match="dynamic dimension 'batch'"):
        import_onnx(path)


def _reduce_model(opset: int) -> onnx.ModelProto:
    """ReduceSum over axis 1: `axes` is an attribute before opset 13 and an input from 13 on."""
    if opset < 13:
        nodes = [helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=1)]
        inits = []
    else:
        nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)]
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    graph = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_opset_versions_of_an_op(save_model, opset):
    path = save_model(_reduce_model(opset))
    graph = import_onnx(path)
    assert graph.opset == opset
    pg = lower(graph)
    feeds = make_inputs(pg, seed=opset)
    np.testing.assert_allclose(run_reference(pg, feeds)["y"], run_ort(path, feeds)["y"], rtol=1e-5)


def test_too_old_opset_is_refused(save_model):
    model = tiny_model("Relu", (2, 3), opset=6)
    model.ir_version = 3
    with pytest.raises(ModelError, match="opset 6 is too old"):
        import_onnx(save_model(model))


def test_external_data_inside_folder_loads(save_model):
    path = save_model(external_data_model("w.bin"), "m/model.onnx")
    (path.parent / "w.bin").write_bytes(EXTERNAL_W.tobytes())
    pg = load_graph(path)
    np.testing.assert_array_equal(pg.weights["w"], EXTERNAL_W)


@pytest.mark.parametrize("location", ["../w.bin", "/etc/passwd", "sub/../../w.bin"])
def test_external_data_outside_folder_refused(save_model, tmp_path, location):
    (tmp_path / "w.bin").write_bytes(EXTERNAL_W.tobytes())
    path = save_model(external_data_model(location), "m/model.onnx")
    with pytest.raises(ModelError, match="outside the model's folder"):
        import_onnx(path)


def test_missing_external_file(save_model):
    with pytest.raises(ModelError, match="is missing"):
        import_onnx(save_model(external_data_model("w.bin"), "m/model.onnx"))


def test_unsupported_and_custom_domain_ops(save_model):
    with pytest.raises(UnsupportedOpError, match=r"op Det \(node 'det_0'\).*docs/onnx-conformance.md"):
        import_onnx(save_model(tiny_model("Det", (3, 3))))
    model = tiny_model("Relu", (2, 3))
    model.graph.node[0].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError, match="custom domain"):
        import_onnx(save_model(model))


def test_unsupported_input_dtype(save_model):
    with pytest.raises(ModelError, match="COMPLEX64"):
        import_onnx(save_model(tiny_model("Relu", (2, 3), elem=TensorProto.COMPLEX64)))
