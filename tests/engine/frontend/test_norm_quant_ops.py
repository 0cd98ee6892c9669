"""CumProd, LpNormalization, LRN, Hardmax, OneHot, EyeLike, ReverseSequence, TensorScatter and QDQ quantization
(QuantizeLinear/DequantizeLinear): random cases against onnxruntime on the reference executor, and graphs of
them — a QDQ convolution, an AlexNet-style LRN block — on the C backend under every policy and under the SIMT
emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, graph_model, max_rel_error, ort_outputs  # noqa: E402

from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, outs: dict, opset: int = 21) -> onnx.ModelProto:
    return graph_model(nodes, inputs, consts, outs, opset)


def _check(model: onnx.ModelProto, feeds: dict, exact: bool = False) -> None:
    want = ort_outputs(model, feeds)
    got = run_reference(lower(import_onnx(model)), feeds)
    for name, w in zip((o.name for o in model.graph.output), want):
        if exact:
            np.testing.assert_array_equal(got[name], w)
        else:
            assert max_rel_error(got[name], w) < 1e-5, name


rng = np.random.default_rng(0)
F = TensorProto.FLOAT


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1}, {"reverse": 1}, {"exclusive": 1, "reverse": 1}])
def test_cumprod_matches_numpy(attrs):
    x = rng.uniform(0.5, 1.5, (3, 7)).astype(np.float32)
    model = _model([helper.make_node("CumProd", ["x", "axis"], ["y"], **attrs)], {"x": x},
                   {"axis": np.asarray(1, np.int64)}, {"y": F}, 26)
    got = run_reference(lower(import_onnx(model)), {"x": x})["y"]
    src = x[:, ::-1] if attrs.get("reverse") else x
    want = np.cumprod(src, axis=1)
    if attrs.get("exclusive"):
        want = np.concatenate([np.ones((3, 1), np.float32), want[:, :-1]], axis=1)
    assert max_rel_error(got, want[:, ::-1] if attrs.get("reverse") else want) < 1e-6


@pytest.mark.parametrize(("p", "axis"), [(1, 1), (2, -1), (2, 0)])
def test_lp_normalization_matches_onnxruntime(p, axis):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    _check(_model([helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)], {"x": x}, {}, {"y": F}), {"x": x})


@pytest.mark.parametrize("size", [1, 3, 4])
def test_lrn_matches_onnxruntime(size):
    x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    model = _model([helper.make_node("LRN", ["x"], ["y"], size=size, alpha=0.01, beta=0.6, bias=2.0)], {"x": x}, {},
                   {"y": F})
    if size % 2:
        _check(model, {"x": x})
    else:  # onnxruntime refuses an even window (and onnx.reference's LRN loops over the batch, not the channels):
        # the spec's window, floor((size - 1) / 2) channels before and ceil((size - 1) / 2) after
        squares = np.pad(x.astype(np.float64) ** 2, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
        total = sum(squares[:, k:k + x.shape[1]] for k in range(size))
        want = x / (2.0 + 0.01 / size * total) ** 0.6
        assert max_rel_error(run_reference(lower(import_onnx(model)), {"x": x})["y"], want) < 1e-5


@pytest.mark.parametrize(("opset", "axis"), [(13, 1), (13, -1), (11, 1)])
def test_hardmax_matches_onnxruntime_with_ties(opset, axis):
    x = rng.integers(-2, 3, (2, 3, 4)).astype(np.float32)  # ties: the first largest wins
    _check(_model([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], {"x": x}, {}, {"y": F}, opset), {"x": x},
           exact=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_matches_onnxruntime_with_negative_indices(axis):
    idx = rng.integers(-5, 5, (3, 4)).astype(np.int64)
    model = _model([helper.make_node("OneHot", ["idx", "depth", "values"], ["y"], axis=axis)], {"idx": idx},
                   {"depth": np.asarray(5, np.int64), "values": np.asarray([-1.0, 3.0], np.float32)}, {"y": F})
    _check(model, {"idx": idx}, exact=True)


def test_eye_like_is_a_constant_of_its_input_shape():
    x = rng.standard_normal((3, 5)).astype(np.float32)
    model = _model([helper.make_node("EyeLike", ["x"], ["e"], k=1), helper.make_node("Add", ["x", "e"], ["y"])],
                   {"x": x}, {}, {"y": F})
    _check(model, {"x": x})


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
def test_reverse_sequence_matches_onnxruntime(batch_axis, time_axis):
    shape = (5, 3, 2) if time_axis == 0 else (3, 5, 2)
    x = rng.standard_normal(shape).astype(np.float32)
    lens = np.asarray([5, 2, 0], np.int64)
    model = _model([helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis,
                                     time_axis=time_axis)], {"x": x, "lens": lens}, {}, {"y": F})
    _check(model, {"x": x, "lens": lens}, exact=True)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_each_entrys_update_at_its_index(mode):
    past = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    update = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
    w = np.asarray([1, 5], np.int64)
    model = _model([helper.make_node("TensorScatter", ["past", "update", "w"], ["y"], mode=mode)],
                   {"past": past, "update": update, "w": w}, {}, {"y": F}, 24)
    got = run_reference(lower(import_onnx(model)), {"past": past, "update": update, "w": w})["y"]
    want = past.copy()
    for b in range(2):
        for s in range(2):
            t = w[b] + s
            if mode == "circular":
                t %= 6
            if t < 6:
                want[b, :, t] = update[b, :, s]
    np.testing.assert_array_equal(got, want)


# x shape, scale shape, axis, block size, zero point dtype (None: no zero point)
QDQ = [((2, 8), (), 1, 0, np.uint8), ((2, 8), (8,), 1, 0, np.int8), ((4, 6), (4,), 0, 0, np.uint8),
       ((2, 8), (2, 4), 1, 2, np.int8), ((3, 5), (), 1, 0, None), ((3, 5), (5,), 1, 0, np.int16)]


@pytest.mark.parametrize(("shape", "sshape", "axis", "block", "zdt"), QDQ)
def test_quantize_then_dequantize_matches_onnxruntime(shape, sshape, axis, block, zdt):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.flat[:3] = [0.5, 1.5, -2.5]  # halves round to even
    scale = rng.uniform(0.01, 0.1, sshape).astype(np.float32)
    consts = {"scale": scale}
    ins = ["x", "scale"]
    if zdt is not None:
        consts["zp"] = rng.integers(np.iinfo(zdt).min // 2, np.iinfo(zdt).max // 2, sshape).astype(zdt)
        ins.append("zp")
    attrs = {"axis": axis, **({"block_size": block} if block else {})}
    model = _model([helper.make_node("QuantizeLinear", ins, ["q"], **attrs),
                    helper.make_node("DequantizeLinear", ["q", *ins[1:]], ["y"], **attrs)], {"x": x}, consts,
                   {"q": helper.np_dtype_to_tensor_dtype(np.dtype(zdt or np.uint8)), "y": F})
    _check(model, {"x": x}, exact=True)


def _qdq_conv(path: Path) -> Path:
    """A QDQ-quantized conv block as quantization tools write it: activations quantized and dequantized
    (uint8, per tensor), the weight stored int8 per output channel and dequantized, the conv, LRN and Hardmax."""
    r = np.random.default_rng(3)
    w = r.integers(-100, 100, (6, 3, 3, 3)).astype(np.int8)
    consts = {"s": np.asarray(0.05, np.float32), "z": np.asarray(128, np.uint8), "w": w,
              "ws": r.uniform(0.002, 0.01, 6).astype(np.float32), "wz": np.zeros(6, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("LRN", ["c"], ["n"], size=3),
             helper.make_node("Hardmax", ["n"], ["h"], axis=1), helper.make_node("Add", ["n", "h"], ["y"])]
    onnx.save(_model(nodes, {"x": np.zeros((1, 3, 8, 8), np.float32)}, consts, {"y": F}), path)
    return path


def _qdq_feeds() -> dict:
    return {"x": np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_qdq_conv_block_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_qdq_conv(tmp_path / "qdq.onnx"), _qdq_feeds(), policy=policy)


def test_qdq_conv_block_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_qdq_conv(tmp_path / "qdq.onnx"), _qdq_feeds(), backend="cuda-sim")


@pytest.mark.parametrize(("node", "consts", "match"), [
    (helper.make_node("LpNormalization", ["x"], ["y"], p=3), {}, "p=3"),
    (helper.make_node("QuantizeLinear", ["x", "s"], ["y"]), {"s": np.ones(3, np.float32)}, "of shape \\[3\\]"),
    (helper.make_node("TensorScatter", ["x", "x"], ["y"], axis=0), {}, "a non-batch axis"),
])
def test_what_they_do_not_do_is_refused_in_one_line(node, consts, match):
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 4))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8 if node.op_type == "QuantizeLinear"
                                                         else TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)
    with pytest.raises(UnsupportedOpError, match=match) as err:
        lower(import_onnx(model))
    assert "\n" not in str(err.value)
