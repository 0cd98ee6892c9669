"""Tests for engine/frontend/schema.py: the opset range and node input types against ONNX schemas."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper
from support import tiny_model

from engine.errors import ModelError
from engine.frontend.importer import import_onnx
from engine.frontend.schema import MIN_OPSET, check_node_types, check_opset, max_opset, onnx_type_name
from engine.ir.dtypes import DType


def test_opset_range_is_named_in_the_refusal():
    assert check_opset(17) == 17 and check_opset(max_opset()) == max_opset()
    for bad in (MIN_OPSET - 1, max_opset() + 1, 99):
        with pytest.raises(ModelError) as info:
            check_opset(bad)
        assert f"opsets {MIN_OPSET} to {max_opset()}" in str(info.value)
    with pytest.raises(ModelError, match="no default-domain opset"):
        check_opset(None)


def test_type_names_follow_the_schemas():
    assert onnx_type_name(DType.F32) == "tensor(float)" and onnx_type_name(DType.F64) == "tensor(double)"
    assert onnx_type_name(DType.F8E4M3FN) == "tensor(float8e4m3fn)"


def test_inputs_bound_to_one_type_parameter_must_agree():
    check_node_types("Add", "", "a", 17, ("x", "y"), (DType.F32, DType.F32))
    with pytest.raises(ModelError) as info:
        check_node_types("Add", "", "add0", 17, ("x", "y"), (DType.F32, DType.I64))
    assert "node 'add0'" in str(info.value) and "Cast" in str(info.value)
    # Where's condition is a fixed bool; its two value inputs share T.
    check_node_types("Where", "", "w", 17, ("c", "a", "b"), (DType.BOOL, DType.I64, DType.I64))
    with pytest.raises(ModelError, match="type B allows bool"):
        check_node_types("Where", "", "w", 17, ("c", "a", "b"), (DType.F32, DType.I64, DType.I64))
    # Optional inputs left out are skipped; heterogeneous variadics (Concat is homogeneous) are not.
    check_node_types("Clip", "", "c", 13, ("x", "", "hi"), (DType.F32, None, DType.F32))
    with pytest.raises(ModelError, match="inputs\\[1\\]"):
        check_node_types("Concat", "", "cat", 13, ("a", "b"), (DType.F32, DType.F16))


def test_type_outside_a_constraint_and_per_opset_schemas():
    with pytest.raises(ModelError, match="does not take"):
        check_node_types("Relu", "", "r", 17, ("x",), (DType.BOOL,))
    check_node_types("Relu", "", "r", 14, ("x",), (DType.I32,))  # integers since opset 14
    with pytest.raises(ModelError, match="opset 13"):
        check_node_types("Relu", "", "r", 13, ("x",), (DType.I32,))
    check_node_types("NoSuchOp", "", "n", 17, ("x",), (DType.F32,))  # left to the converter lookup


def test_import_refuses_the_issue_models(save_model):
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy")
    b = helper.make_tensor_value_info("b", TensorProto.INT64, [2])
    bad = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"], name="add0")], "g",
                                              [x, b], [y]), opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    with pytest.raises(ModelError, match="add0"):
        import_onnx(save_model(bad))
    with pytest.raises(ModelError, match="opset 99"):
        import_onnx(save_model(tiny_model("Relu", opset=99), "o99.onnx"))
    assert import_onnx(save_model(tiny_model("Relu"), "ok.onnx")).opset == 17
