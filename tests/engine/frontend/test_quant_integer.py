"""MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv (engine/frontend/ops/quant_integer.py): exact int32
products against onnxruntime, sums past fp32's 2^24 included, zero points per tensor, row, column and output
channel; onnxruntime's dynamic quantization of a linear layer (DynamicQuantizeLinear, MatMulInteger, the scales
applied in float) and a QOperator conv block (QLinearConv, strided and grouped, into a QLinearMatMul head) on the
C backend under every policy and under the SIMT emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, graph_model, ort_outputs  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, outs: dict, opset: int = 21) -> onnx.ModelProto:
    return graph_model(nodes, inputs, consts, outs, opset)


# a dtype, b dtype, zero points: none, per tensor, per column of b (onnxruntime takes a's per tensor only)
CASES = [(np.uint8, np.int8, "none"), (np.uint8, np.uint8, "tensor"), (np.int8, np.int8, "axis")]


@pytest.mark.parametrize(("adt", "bdt", "zeros"), CASES)
def test_matmul_integer_is_exact_on_the_c_backend(tmp_path, adt, bdt, zeros):
    rng = np.random.default_rng(1)
    m, k, n = 3, 1100, 5
    a = rng.integers(np.iinfo(adt).min, np.iinfo(adt).max, (m, k), endpoint=True).astype(adt)
    b = rng.integers(np.iinfo(bdt).min, np.iinfo(bdt).max, (k, n), endpoint=True).astype(bdt)
    a[0, :] = np.iinfo(adt).max  # a row whose sum passes 2^24: fp32 would round it
    b[:, 0] = np.iinfo(bdt).max
    consts, ins = {}, ["a", "b"]
    if zeros != "none":
        shape_a, shape_b = ((), ()) if zeros == "tensor" else ((), (n,))
        consts["za"] = rng.integers(0, 10, shape_a).astype(adt)
        consts["zb"] = rng.integers(0, 10, shape_b).astype(bdt)
        ins += ["za", "zb"]
    model = _model([helper.make_node("MatMulInteger", ins, ["y"])], {"a": a, "b": b}, consts, {"y": TensorProto.INT32})
    want = ort_outputs(model, {"a": a, "b": b})[0]
    assert abs(int(want[0, 0])) > 2 ** 24 or zeros != "none"
    np.testing.assert_array_equal(run_reference(lower(import_onnx(model)), {"a": a, "b": b})["y"], want)
    onnx.save(model, tmp_path / "mi.onnx")
    got = run_model(load_graph(tmp_path / "mi.onnx"), {"a": a, "b": b}, backend="cpu", policy="welder").outputs["y"]
    np.testing.assert_array_equal(got, want)


def test_qlinear_matmul_matches_onnxruntime():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 255, (2, 4, 16)).astype(np.uint8)
    b = rng.integers(-128, 127, (16, 6)).astype(np.int8)
    consts = {"sa": np.asarray(0.02, np.float32), "za": np.asarray(120, np.uint8), "sb": np.asarray(0.01, np.float32),
              "zb": np.asarray(3, np.int8), "sy": np.asarray(0.05, np.float32), "zy": np.asarray(100, np.uint8)}
    model = _model([helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])],
                   {"a": a}, {**consts, "b": b}, {"y": TensorProto.UINT8})
    np.testing.assert_array_equal(run_reference(lower(import_onnx(model)), {"a": a})["y"],
                                  ort_outputs(model, {"a": a})[0])


def _dynamic_linear(path: Path) -> Path:
    """A linear layer as onnxruntime's quantize_dynamic writes it: the activation quantized at run time (its scale
    and zero point computed from its range), an int8 weight, the int32 product, scaled back and biased in float."""
    rng = np.random.default_rng(3)
    consts = {"w": rng.integers(-127, 127, (24, 10)).astype(np.int8), "zw": np.asarray(0, np.int8),
              "sw": np.asarray(0.004, np.float32), "bias": rng.standard_normal(10).astype(np.float32)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "sx", "zx"]),
             helper.make_node("MatMulInteger", ["xq", "w", "zx", "zw"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["sx", "sw"], ["s"]), helper.make_node("Mul", ["accf", "s"], ["lin"]),
             helper.make_node("Add", ["lin", "bias"], ["y"])]
    onnx.save(_model(nodes, {"x": np.zeros((6, 24), np.float32)}, consts, {"y": TensorProto.FLOAT}), path)
    return path


def _dynamic_feeds() -> dict:
    return {"x": np.random.default_rng(4).standard_normal((6, 24)).astype(np.float32)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_dynamically_quantized_linear_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_dynamic_linear(tmp_path / "dq.onnx"), _dynamic_feeds(), policy=policy, tol=1e-6)


def test_dynamically_quantized_linear_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_dynamic_linear(tmp_path / "dq.onnx"), _dynamic_feeds(), backend="cuda-sim", tol=1e-6)


def test_a_zero_point_per_row_of_a_follows_the_spec():
    """onnxruntime takes a's zero point per tensor only; the spec allows one per row: held to NumPy."""
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 255, (4, 9)).astype(np.uint8), rng.integers(-128, 127, (9, 3)).astype(np.int8)
    za, zb = rng.integers(0, 255, 4).astype(np.uint8), rng.integers(-5, 5, 3).astype(np.int8)
    model = _model([helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])], {"a": a},
                   {"b": b, "za": za, "zb": zb}, {"y": TensorProto.INT32})
    want = (a.astype(np.int32) - za[:, None].astype(np.int32)) @ (b.astype(np.int32) - zb[None, :].astype(np.int32))
    np.testing.assert_array_equal(run_reference(lower(import_onnx(model)), {"a": a})["y"], want)



@pytest.mark.parametrize(("attrs", "per_channel"), [({"pads": [1, 1, 1, 1]}, False),
                                                   ({"strides": [2, 2], "group": 2}, True)])
def test_conv_integer_and_qlinear_conv_match_onnxruntime(attrs, per_channel):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 255, (1, 4, 7, 7)).astype(np.uint8)
    w = rng.integers(-127, 127, (6, 4 // attrs.get("group", 1), 3, 3)).astype(np.int8)
    zw = (rng.integers(-3, 3, 6) if per_channel else np.asarray(2)).astype(np.int8)
    consts = {"w": w, "zx": np.asarray(128, np.uint8), "zw": zw, "sx": np.asarray(0.02, np.float32),
              "sw": (rng.uniform(0.001, 0.01, 6) if per_channel else np.asarray(0.005)).astype(np.float32),
              "sy": np.asarray(0.1, np.float32), "zy": np.asarray(10, np.uint8),
              "bias": rng.integers(-500, 500, 6).astype(np.int32)}
    nodes = [helper.make_node("ConvInteger", ["x", "w", "zx", "zw"], ["acc"], **attrs),
             helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"], ["y"], **attrs)]
    if per_channel:  # onnxruntime's ConvInteger takes w's zero point per tensor only: QLinearConv alone
        nodes = nodes[1:]
    outs = {"y": TensorProto.UINT8} if per_channel else {"acc": TensorProto.INT32, "y": TensorProto.UINT8}
    model = _model(nodes, {"x": x}, consts, outs)
    got = run_reference(lower(import_onnx(model)), {"x": x})
    for name, want in zip(outs, ort_outputs(model, {"x": x})):
        np.testing.assert_array_equal(got[name], want)


def _qoperator(path: Path) -> Path:
    """A QOperator-format block as onnxruntime's static quantization writes it: the input quantized, a strided
    QLinearConv with per-channel weight scales and an int32 bias, a pointwise QLinearConv, flattened into a
    QLinearMatMul, dequantized."""
    rng = np.random.default_rng(8)
    c = {"s0": np.asarray(0.03, np.float32), "z0": np.asarray(128, np.uint8),
         "w1": rng.integers(-127, 127, (8, 3, 3, 3)).astype(np.int8), "sw1": rng.uniform(0.002, 0.01, 8).astype(
             np.float32), "zw1": np.zeros(8, np.int8), "b1": rng.integers(-300, 300, 8).astype(np.int32),
         "s1": np.asarray(0.05, np.float32), "z1": np.asarray(120, np.uint8),
         "w2": rng.integers(-127, 127, (4, 8, 1, 1)).astype(np.int8), "sw2": np.asarray(0.006, np.float32),
         "zw2": np.asarray(0, np.int8), "s2": np.asarray(0.04, np.float32), "z2": np.asarray(125, np.uint8),
         "shape": np.asarray([1, 64], np.int64), "w3": rng.integers(-127, 127, (64, 5)).astype(np.int8),
         "sw3": np.asarray(0.004, np.float32), "zw3": np.asarray(0, np.int8), "s3": np.asarray(0.08, np.float32),
         "z3": np.asarray(128, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("QLinearConv", ["q0", "s0", "z0", "w1", "sw1", "zw1", "s1", "z1", "b1"], ["q1"],
                              strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("QLinearConv", ["q1", "s1", "z1", "w2", "sw2", "zw2", "s2", "z2"], ["q2"]),
             helper.make_node("Reshape", ["q2", "shape"], ["flat"]),
             helper.make_node("QLinearMatMul", ["flat", "s2", "z2", "w3", "sw3", "zw3", "s3", "z3"], ["q3"]),
             helper.make_node("DequantizeLinear", ["q3", "s3", "z3"], ["y"])]
    onnx.save(_model(nodes, {"x": np.zeros((1, 3, 8, 8), np.float32)}, c, {"y": TensorProto.FLOAT}), path)
    return path


def _qoperator_feeds() -> dict:
    return {"x": np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_qoperator_block_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_qoperator(tmp_path / "qop.onnx"), _qoperator_feeds(), policy=policy, tol=1e-6)


def test_qoperator_block_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_qoperator(tmp_path / "qop.onnx"), _qoperator_feeds(), backend="cuda-sim", tol=1e-6)
