"""Attention, RMSNormalization and RotaryEmbedding (opset 23+; engine/frontend/ops/attention.py): random cases
against onnxruntime on the reference executor, a decoder block of all three on the C backend under every
policy and as CUDA under the SIMT emulator, and one-line refusals of what they do not do."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import graph_model, max_rel_error, ort_outputs  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.ir.graph import StageKind  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, outs=("y",), opset: int = 23):
    return graph_model(nodes, inputs, consts, outs, opset)


_ort = ort_outputs


# name: (Q, K, V shapes, past length or 0, attributes, mask: None | "float" | "bool" | "short", nonpad lengths)
ATTENTION = {
    "4d_plain": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 6), 0, {}, None, None),
    "4d_gqa_causal_past": ((2, 6, 3, 8), (2, 2, 3, 8), (2, 2, 3, 8), 4, dict(is_causal=1), None, None),
    "3d_gqa_float_mask": ((2, 4, 48), (2, 6, 16), (2, 6, 12), 0, dict(q_num_heads=6, kv_num_heads=2), "float",
                          None),
    "4d_bool_mask_softcap_scale": ((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8), 0, dict(softcap=1.5, scale=0.2),
                                   "bool", None),
    "4d_short_mask_past": ((2, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4), 2, {}, "short", None),
    "4d_causal_nonpad": ((3, 2, 2, 8), (3, 2, 6, 8), (3, 2, 6, 8), 0, dict(is_causal=1), None, [6, 4, 3]),
}


def _attention_case(case: str, seed: int):
    qs, ks, vs, past, attrs, mask, nonpad = ATTENTION[case]
    rng = np.random.default_rng(seed)
    feeds = {"q": rng.standard_normal(qs).astype(np.float32), "k": rng.standard_normal(ks).astype(np.float32),
             "v": rng.standard_normal(vs).astype(np.float32)}
    ins = ["q", "k", "v", "", "", "", ""]
    total = ks[-2] + past if len(ks) == 4 else ks[1] + past
    sq = qs[2] if len(qs) == 4 else qs[1]
    if mask is not None:
        keys = total - 1 if mask == "short" else total
        feeds["m"] = (rng.random((sq, keys)) > 0.3) if mask == "bool" else \
            rng.standard_normal((qs[0], 1, sq, keys)).astype(np.float32)
        ins[3] = "m"
    outs = ["y"]
    if past:
        b, hk, _, d = ks
        feeds["pk"] = rng.standard_normal((b, hk, past, d)).astype(np.float32)
        feeds["pv"] = rng.standard_normal((b, hk, past, vs[-1])).astype(np.float32)
        ins[4], ins[5] = "pk", "pv"
        outs += ["present_k", "present_v"]
    opset = 23
    if nonpad is not None:
        feeds["n"] = np.asarray(nonpad, np.int64)
        ins[6] = "n"
        opset = 24
    while ins[-1] == "":
        ins.pop()
    node = helper.make_node("Attention", ins, outs, **attrs)
    return _model([node], feeds, {}, outs, opset), feeds, outs


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_attention_matches_onnxruntime(case):
    model, feeds, outs = _attention_case(case, len(case))
    pg = lower(import_onnx(model))
    got = run_reference(pg, feeds)
    # onnxruntime refuses a mask shorter than the keys (the spec pads it with masked keys): the onnx
    # package's reference implementation is the oracle there.
    wants = ReferenceEvaluator(model).run(None, feeds) if ATTENTION[case][5] == "short" else _ort(model, feeds)
    for name, want in zip(outs, wants):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
    # Two contractions (scores, then probabilities times values) and the guarded softmax's two reductions.
    kinds = [s.kind for s in pg.stages]
    assert kinds.count(StageKind.CONTRACTION) == 2 and kinds.count(StageKind.REDUCE) == 2


def test_a_fully_masked_row_gives_zeros_not_nan():
    """The reference's guard: a query row whose every key is masked attends nothing (0), where a plain softmax
    would divide 0 by 0."""
    rng = np.random.default_rng(3)
    feeds = {"q": rng.standard_normal((1, 1, 3, 4)).astype(np.float32),
             "k": rng.standard_normal((1, 1, 3, 4)).astype(np.float32),
             "v": rng.standard_normal((1, 1, 3, 4)).astype(np.float32),
             "m": np.array([[True, False, True], [False, False, False], [True, True, True]])}
    model = _model([helper.make_node("Attention", ["q", "k", "v", "m"], ["y"])], feeds, {})
    got = run_reference(lower(import_onnx(model)), feeds)["y"]
    assert np.isfinite(got).all() and not got[0, 0, 1].any()
    np.testing.assert_allclose(got, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("shape", "axis"), [((2, 5, 16), -1), ((2, 3, 4, 6), 1), ((7, 9), 0)])
def test_rms_normalization_matches_onnxruntime(shape, axis):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[axis:] if axis >= 0 else shape[axis:]).astype(np.float32)
    model = _model([helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=axis, epsilon=1e-3)],
                   {"x": x}, {"w": w})
    got = run_reference(lower(import_onnx(model)), {"x": x})["y"]
    np.testing.assert_allclose(got, _ort(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("shape", "attrs", "positions"), [
    ((2, 3, 5, 8), {}, True), ((2, 3, 5, 8), dict(interleaved=1, rotary_embedding_dim=4), True),
    ((2, 5, 24), dict(num_heads=3, interleaved=1), False), ((1, 4, 16), dict(num_heads=2, rotary_embedding_dim=6),
                                                            True)])
def test_rotary_embedding_matches_onnxruntime(shape, attrs, positions):
    rng = np.random.default_rng(len(shape) + len(attrs))
    x = rng.standard_normal(shape).astype(np.float32)
    b, s = shape[0], shape[2] if len(shape) == 4 else shape[1]
    head = shape[3] if len(shape) == 4 else shape[2] // attrs["num_heads"]
    half = attrs.get("rotary_embedding_dim", head) // 2
    feeds = {"x": x}
    if positions:
        angles = rng.random((20, half)).astype(np.float32) * 6
        feeds["pos"] = rng.integers(0, 20, (b, s)).astype(np.int64)
        ins = ["x", "cos", "sin", "pos"]
    else:
        angles = rng.random((b, s, half)).astype(np.float32) * 6
        ins = ["x", "cos", "sin"]
    consts = {"cos": np.cos(angles), "sin": np.sin(angles)}
    model = _model([helper.make_node("RotaryEmbedding", ins, ["y"], **attrs)], feeds, consts)
    got = run_reference(lower(import_onnx(model)), feeds)["y"]
    np.testing.assert_allclose(got, _ort(model, feeds)[0], rtol=1e-4, atol=1e-5)


def _decoder_block(path: Path) -> Path:
    """RMSNorm -> Q/K/V projections -> rotary on Q and K -> causal grouped-query Attention (3-D, in place) ->
    output projection -> residual: a Llama-style block as torch's exporter writes it at opset 23."""
    rng = np.random.default_rng(17)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    angles = np.arange(16)[:, None] * (1.0 / 100 ** (np.arange(4) / 4))[None, :]
    consts = {"g": w(32) + 1, "wq": w(32, 32), "wk": w(32, 16), "wv": w(32, 16), "wo": w(32, 32),
              "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    nodes = [helper.make_node("RMSNormalization", ["x", "g"], ["h"], epsilon=1e-5),
             helper.make_node("MatMul", ["h", "wq"], ["q0"]), helper.make_node("MatMul", ["h", "wk"], ["k0"]),
             helper.make_node("MatMul", ["h", "wv"], ["v"]),
             helper.make_node("RotaryEmbedding", ["q0", "cos", "sin", "pos"], ["q"], num_heads=4),
             helper.make_node("RotaryEmbedding", ["k0", "cos", "sin", "pos"], ["k"], num_heads=2),
             helper.make_node("Attention", ["q", "k", "v"], ["a"], is_causal=1, q_num_heads=4, kv_num_heads=2),
             helper.make_node("MatMul", ["a", "wo"], ["o"]), helper.make_node("Add", ["x", "o"], ["y"])]
    feeds = {"x": np.zeros((2, 6, 32), np.float32), "pos": np.zeros((2, 6), np.int64)}
    onnx.save(_model(nodes, feeds, consts), path)
    return path


def _decoder_feeds():
    rng = np.random.default_rng(23)
    return {"x": rng.standard_normal((2, 6, 32)).astype(np.float32),
            "pos": np.tile(np.arange(3, 9, dtype=np.int64), (2, 1))}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_decoder_block_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    path = _decoder_block(tmp_path / "block.onnx")
    feeds = _decoder_feeds()
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = run_model(load_graph(path), feeds, backend="cpu", policy=policy).outputs["y"]
    assert max_rel_error(got, want) < 1e-4


def test_decoder_block_cuda_runs_under_the_simt_emulator(tmp_path):
    """The CUDA printed for the welder plan (masks as selects in the logits' epilogue, the rotary gather
    through position ids), compiled with NVRTC and run by the SIMT emulator: outputs, and no finding."""
    path = _decoder_block(tmp_path / "block.onnx")
    feeds = _decoder_feeds()
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    result = run_model(load_graph(path), feeds, backend="cuda-sim", policy="welder")
    assert max_rel_error(result.outputs["y"], want) < 1e-4
    assert not result.sim.findings, result.sim.findings


@pytest.mark.parametrize(("node", "inputs", "match"), [
    (helper.make_node("Attention", ["q", "k", "v"], ["y"]), {"q": (2, 24), "k": (2, 24), "v": (2, 24)},
     "rank 2"),
    (helper.make_node("Attention", ["q", "k", "v"], ["y"]), {"q": (1, 4, 24), "k": (1, 4, 24), "v": (1, 4, 24)},
     "q_num_heads/kv_num_heads must be given"),
    (helper.make_node("Attention", ["q", "k", "v"], ["y"]), {"q": (1, 3, 4, 8), "k": (1, 2, 4, 8),
                                                             "v": (1, 2, 4, 8)}, "3 query heads over 2"),
    (helper.make_node("RotaryEmbedding", ["q", "k", "v"], ["y"], rotary_embedding_dim=3),
     {"q": (1, 2, 4, 8), "k": (9, 1), "v": (9, 1)}, "rotary_embedding_dim 3"),
    (helper.make_node("RMSNormalization", ["q", "k"], ["y"], stash_type=0), {"q": (2, 4), "k": (4,)},
     "stash_type"),
])
def test_what_they_do_not_do_is_refused_in_one_line(node, inputs, match):
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                        for n, s in inputs.items()],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    with pytest.raises(UnsupportedOpError, match=match) as err:
        lower(import_onnx(model))
    assert "\n" not in str(err.value)


def test_softmax_precision_is_the_dtype_the_softmax_runs_in():
    """softmax_precision float16 on float32 inputs: the softmax rounds to half precision (as the reference
    computes it), visibly apart from the float32 softmax; float32 itself changes nothing."""
    rng = np.random.default_rng(12)
    feeds = {n: rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for n in ("q", "k", "v")}

    def run(**attrs):
        model = _model([helper.make_node("Attention", ["q", "k", "v"], ["y"], **attrs)], feeds, {})
        return run_reference(lower(import_onnx(model)), feeds)["y"], model

    plain, _ = run()
    same, _ = run(softmax_precision=TensorProto.FLOAT)
    half, model = run(softmax_precision=TensorProto.FLOAT16)
    np.testing.assert_array_equal(same, plain)
    np.testing.assert_allclose(half, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-3, atol=1e-4)
    assert np.abs(half - plain).max() > 1e-5
