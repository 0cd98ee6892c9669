"""GRU and RNN (engine/frontend/ops/rnn.py, unrolled as LSTM is), CumSum (ops/reduce.py) and
DepthToSpace/SpaceToDepth (ops/layout.py): random cases against onnxruntime on the reference executor, the
attribute combinations the ONNX node tests leave out (linear_before_reset, clip, initial state, activations),
and small graphs of them on the C backend under every policy and as CUDA under the SIMT emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import graph_model, max_rel_error, ort_outputs  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, outs=("y",), opset: int = 22):
    return graph_model(nodes, inputs, consts, outs, opset)


_ort = ort_outputs


# name: (op, seq, batch, input, hidden, directions, attributes, with bias, with initial state, layout)
RECURRENT = {
    "gru_reset_after": ("GRU", 4, 2, 3, 5, 1, dict(linear_before_reset=1), True, True, 0),
    "gru_reset_before_clip": ("GRU", 3, 2, 4, 3, 1, dict(clip=0.7), True, True, 0),
    "gru_bidirectional_no_bias_batchwise": ("GRU", 3, 2, 2, 4, 2, dict(direction="bidirectional", layout=1), False,
                                            True, 1),
    "gru_reverse_no_state": ("GRU", 5, 1, 3, 4, 1, dict(direction="reverse", linear_before_reset=1), True, False,
                             0),
    "rnn_relu_state": ("RNN", 4, 3, 2, 5, 1, dict(activations=["Relu"]), True, True, 0),
    "rnn_bidirectional_clip": ("RNN", 3, 2, 3, 4, 2, dict(direction="bidirectional", clip=0.5), True, False, 0),
}


@pytest.mark.parametrize("case", sorted(RECURRENT))
def test_recurrent_matches_onnxruntime(case):
    op, seq, batch, isz, hid, ndir, attrs, bias, state, layout = RECURRENT[case]
    gates = 3 if op == "GRU" else 1
    rng = np.random.default_rng(len(case))
    xs = (seq, batch, isz) if layout == 0 else (batch, seq, isz)
    feeds = {"x": rng.standard_normal(xs).astype(np.float32)}
    consts = {"w": (rng.standard_normal((ndir, gates * hid, isz)) * 0.5).astype(np.float32),
              "r": (rng.standard_normal((ndir, gates * hid, hid)) * 0.5).astype(np.float32)}
    ins = ["x", "w", "r", "", "", ""]
    if bias:
        consts["b"] = rng.standard_normal((ndir, 2 * gates * hid)).astype(np.float32)
        ins[3] = "b"
    if state:
        feeds["h0"] = rng.standard_normal((ndir, batch, hid) if layout == 0 else (batch, ndir, hid)).astype(
            np.float32)
        ins[5] = "h0"
    while ins[-1] == "":
        ins.pop()
    node = helper.make_node(op, ins, ["y", "yh"], hidden_size=hid, **attrs)
    model = _model([node], feeds, consts, ("y", "yh"))
    got = run_reference(lower(import_onnx(model)), feeds)
    # onnxruntime refuses batchwise (layout 1) GRU: the onnx package's reference implementation decides there.
    wants = ReferenceEvaluator(model).run(None, feeds) if layout else _ort(model, feeds)
    for name, want in zip(("y", "yh"), wants):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("seed", range(8))
def test_cumsum_matches_onnxruntime(seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(n) for n in rng.integers(1, 7, int(rng.integers(1, 4))))
    axis = int(rng.integers(-len(shape), len(shape)))
    attrs = dict(exclusive=int(rng.integers(0, 2)), reverse=int(rng.integers(0, 2)))
    x = rng.standard_normal(shape).astype(np.float32)
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["y"], **attrs)], {"x": x},
                   {"axis": np.asarray(axis, np.int64)})
    got = run_reference(lower(import_onnx(model)), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("op", "mode", "shape", "block"), [
    ("DepthToSpace", "DCR", (2, 12, 3, 2), 2), ("DepthToSpace", "CRD", (1, 18, 2, 3), 3),
    ("SpaceToDepth", "DCR", (2, 3, 4, 6), 2)])
def test_depth_space_matches_onnxruntime(op, mode, shape, block):
    x = np.random.default_rng(block).standard_normal(shape).astype(np.float32)
    attrs = dict(blocksize=block) if op == "SpaceToDepth" else dict(blocksize=block, mode=mode)
    model = _model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}, {})
    got = run_reference(lower(import_onnx(model)), {"x": x})["y"]
    np.testing.assert_array_equal(got, _ort(model, {"x": x})[0])


def test_pixel_unshuffle_then_shuffle_is_the_identity():
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 4)).astype(np.float32)
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["s"], blocksize=2, mode="CRD"),
             helper.make_node("DepthToSpace", ["s"], ["y"], blocksize=2, mode="CRD")]
    got = run_reference(lower(import_onnx(_model(nodes, {"x": x}, {}, opset=28))), {"x": x})["y"]
    np.testing.assert_array_equal(got, x)


def _gru_and_shuffle(path: Path) -> Path:
    """A GRU over 6 steps whose outputs a CumSum runs along and a 1x1 conv then pixel shuffle upsamples:
    recurrent, prefix-sum and depth-to-space stages in one graph small enough for every policy."""
    rng = np.random.default_rng(9)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.4).astype(np.float32)

    consts = {"w": w(1, 12, 3), "r": w(1, 12, 4), "b": w(1, 24), "axis": np.asarray(0, np.int64),
              "wc": w(8, 4, 1, 1)}
    nodes = [helper.make_node("GRU", ["x", "w", "r", "b"], ["y"], hidden_size=4),
             helper.make_node("CumSum", ["y", "axis"], ["c"]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[1, 3, 0, 2]),
             helper.make_node("Conv", ["t", "wc"], ["u"]),
             helper.make_node("DepthToSpace", ["u"], ["z"], blocksize=2, mode="CRD")]
    model = _model(nodes, {"x": np.zeros((6, 2, 3), np.float32)}, consts, ("z",))
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_gru_graph_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    path = _gru_and_shuffle(tmp_path / "g.onnx")
    x = np.random.default_rng(2).standard_normal((6, 2, 3)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run_model(load_graph(path), {"x": x}, backend="cpu", policy=policy).outputs["z"]
    assert max_rel_error(got, want) < 1e-4


def test_gru_graph_cuda_runs_under_the_simt_emulator(tmp_path):
    path = _gru_and_shuffle(tmp_path / "g.onnx")
    x = np.random.default_rng(2).standard_normal((6, 2, 3)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    result = run_model(load_graph(path), {"x": x}, backend="cuda-sim", policy="welder")
    assert max_rel_error(result.outputs["z"], want) < 1e-4
    assert not result.sim.findings, result.sim.findings


@pytest.mark.parametrize(("node", "shape", "match"), [
    (helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2), (1, 6, 2, 2), "6 channels for blocksize 2"),
    (helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=3), (1, 2, 4, 6), "spatial size 4x6"),
    (helper.make_node("GRU", ["x", "w", "r"], ["y"], hidden_size=2, activations=["Sigmoid", "Softsign"]),
     (2, 1, 3), "activation Softsign"),
])
def test_what_they_do_not_do_is_refused_in_one_line(node, shape, match):
    consts = {"w": np.ones((1, 6, 3), np.float32), "r": np.ones((1, 6, 2), np.float32)} if node.op_type == "GRU" \
        else {}
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    with pytest.raises(UnsupportedOpError, match=match) as err:
        lower(import_onnx(model))
    assert "\n" not in str(err.value)


def _position_ids(path: Path) -> Path:
    """RoBERTa's position ids as its exports compute them in-graph — cumsum of the non-padding mask, times the
    mask, plus the padding index — gathering rows of a position table added to the token embeddings: indices
    computed by the stages right before the gather. Planning this under welder on the host used to end in
    an AttributeError (the check that refuses fusing the indices into the gather's segment read a message
    attribute PlanError lacks, and the lone candidate it refused was then costed anyway)."""
    rng = np.random.default_rng(4)
    consts = {"pad": np.asarray(1, np.int64), "axis": np.asarray(1, np.int64),
              "tok": rng.standard_normal((50, 8)).astype(np.float32),
              "pos": rng.standard_normal((40, 8)).astype(np.float32)}
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["is_pad"]), helper.make_node("Not", ["is_pad"], ["keep"]),
             helper.make_node("Cast", ["keep"], ["m"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["m", "axis"], ["c"]), helper.make_node("Mul", ["c", "m"], ["cm"]),
             helper.make_node("Add", ["cm", "pad"], ["p"]), helper.make_node("Gather", ["pos", "p"], ["pe"]),
             helper.make_node("Gather", ["tok", "ids"], ["te"]), helper.make_node("Add", ["te", "pe"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("ids", TensorProto.INT64, (2, 12))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return path


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_position_ids_computed_in_graph_plan_and_run_under_every_policy(tmp_path, policy):
    path = _position_ids(tmp_path / "pos.onnx")
    ids = np.random.default_rng(6).integers(0, 50, (2, 12)).astype(np.int64)
    ids[:, -3:] = 1  # trailing padding
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    got = run_model(load_graph(path), {"ids": ids}, backend="cpu", policy=policy).outputs["y"]
    assert max_rel_error(got, want) < 1e-5


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
@pytest.mark.parametrize("op", ["ReduceL1", "ReduceLogSumExp", "ReduceSumSquare"])
def test_reductions_computing_their_terms_plan_and_run_under_every_policy(tmp_path, op, policy):
    """A reduction whose terms are computed (ReduceL1's abs) made the tile search's floor fail to unpack its
    body's operations (a ValueError planning any such graph): each reduction with a body, costed and run."""
    x = np.random.default_rng(3).standard_normal((64, 300)).astype(np.float32)
    model = _model([helper.make_node(op, ["x", "a"], ["y"], keepdims=0)], {"x": x}, {"a": np.asarray([1], np.int64)},
                   opset=18)
    onnx.save(model, tmp_path / "r.onnx")
    got = run_model(load_graph(tmp_path / "r.onnx"), {"x": x}, backend="cpu", policy=policy).outputs["y"]
    assert max_rel_error(got, _ort(model, {"x": x})[0]) < 1e-5


@pytest.mark.parametrize("backend", ["cpu", "cuda-sim"])
@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_a_scalar_computed_after_a_full_reduction_plans_and_runs(tmp_path, policy, backend):
    """A rank-0 elementwise stage (a loss or a scale computed from a whole tensor) got a rank-1 tile from the
    tile search, which codegen refused: planning any such graph failed."""
    x = np.random.default_rng(8).standard_normal((4, 5)).astype(np.float32)
    model = _model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Mul", ["s", "two"], ["y"])],
                   {"x": x}, {"two": np.asarray(2, np.float32)}, opset=13)
    onnx.save(model, tmp_path / "s.onnx")
    got = run_model(load_graph(tmp_path / "s.onnx"), {"x": x}, backend=backend, policy=policy).outputs["y"]
    assert got.shape == ()
    assert max_rel_error(got, _ort(model, {"x": x})[0]) < 1e-6


def test_isnan_cuda_runs_under_the_simt_emulator(tmp_path):
    """IsNaN prints CUDA's global isnan, which the emulator's C++ (whose <cmath> declares it in std) did not
    have: every export guarding a softmax against NaN rows (OPT, Mixtral at opset 20) failed to compile there."""
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    x[1, 3] = x[2, 0] = np.nan
    model = _model([helper.make_node("IsNaN", ["x"], ["m"]), helper.make_node("Where", ["m", "zero", "x"], ["y"])],
                   {"x": x}, {"zero": np.asarray(0.0, np.float32)})
    onnx.save(model, tmp_path / "n.onnx")
    result = run_model(load_graph(tmp_path / "n.onnx"), {"x": x}, backend="cuda-sim", policy="welder")
    np.testing.assert_array_equal(result.outputs["y"], np.where(np.isnan(x), 0.0, x))
    assert not result.sim.findings, result.sim.findings
