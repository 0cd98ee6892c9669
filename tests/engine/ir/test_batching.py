"""Tests for engine/ir/batching.py: Wolong operator batching keeps outputs identical and says why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.frontend.importer import load_graph
from engine.ir.batching import batch_contractions
from engine.ir.graph import StageKind
from engine.runtime.reference import run_reference

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
CATALOG = {e["name"]: e for e in json.loads((SAMPLES / "catalog.json").read_text())}


def sample_path(name: str) -> Path:
    return SAMPLES / CATALOG[name]["file"]


def _inputs(graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype.np) for t in graph.inputs}


def _contractions(graph) -> list[str]:
    return [s.name for s in graph.stages if s.kind == StageKind.CONTRACTION]


@pytest.mark.parametrize("name", ["bert_layer", "vit_block", "lstm"])
def test_batching_keeps_sample_outputs_identical(name: str) -> None:
    graph = load_graph(sample_path(name))
    batched, decisions = batch_contractions(graph)
    io = np.load(sample_path(name).parent / CATALOG[name]["io"])
    feeds = {t.name: io[t.name] for t in graph.inputs}
    want, got = run_reference(graph, feeds), run_reference(batched, feeds)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6 * float(np.abs(want[k]).max()))
    if name == "bert_layer":
        # Q, K and V projections read the same hidden state with three 768x768 weights.
        [qkv] = [d for d in decisions if d.batched]
        assert len(qkv.stages) == 3 and "(768, 2304)" in qkv.reason
        assert len(_contractions(batched)) == len(_contractions(graph)) - 2
        assert batched.stage(qkv.batched).shape == (1, 128, 2304)
        assert not any(s in batched.weights for s in ("encoder.layer.0/Cast_9_out",))


def _gates_model(save_model, *, transposed: bool, k_sizes=(32, 32, 32, 32)):
    """Four LSTM-like gate GEMMs of one input x (MatMul, or Gemm with transB), sigmoid/tanh on top; the
    first gate's raw GEMM is also a graph output."""
    rng = np.random.default_rng(1)
    inits, nodes, outs = [], [], []
    x_dim = k_sizes[0]
    for g, k in enumerate(k_sizes):
        w = rng.standard_normal((16, k) if transposed else (k, 16)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{g}"))
        src = "x" if k == x_dim else f"x{g}"
        if k != x_dim:
            nodes.append(helper.make_node("Slice", ["x", "s0", f"e{g}", "ax"], [src]))
            inits.append(numpy_helper.from_array(np.array([k], np.int64), f"e{g}"))
        if transposed:
            nodes.append(helper.make_node("Gemm", [src, f"w{g}"], [f"g{g}"], transB=1))
        else:
            nodes.append(helper.make_node("MatMul", [src, f"w{g}"], [f"g{g}"]))
        nodes.append(helper.make_node("Sigmoid" if g != 2 else "Tanh", [f"g{g}"], [f"y{g}"]))
        outs.append(f"y{g}")
    inits += [numpy_helper.from_array(np.array([0], np.int64), "s0"),
              numpy_helper.from_array(np.array([1], np.int64), "ax")]
    graph = helper.make_graph(
        nodes, "gates", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, x_dim])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [4, 16]) for o in ["g0", *outs]], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return load_graph(save_model(model))


@pytest.mark.parametrize("transposed", [False, True])
def test_gate_gemms_batch_into_one(save_model, transposed: bool) -> None:
    graph = _gates_model(save_model, transposed=transposed)
    batched, decisions = batch_contractions(graph)
    [d] = [d for d in decisions if d.batched]
    assert len(d.stages) == 4 and f"axis {0 if transposed else 1}" in d.reason
    assert len(_contractions(batched)) == 1
    assert batched.stage(d.batched).shape == (4, 64)
    assert batched.outputs == graph.outputs  # the raw gate output survives as a slice of the batch
    assert batched.stage(graph.outputs[0]).op == "slice"
    feeds = _inputs(graph, seed=3)
    want, got = run_reference(graph, feeds), run_reference(batched, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def test_without_inlining_every_member_becomes_a_slice(save_model) -> None:
    graph = _gates_model(save_model, transposed=False)
    batched, _ = batch_contractions(graph, inline=False)
    slices = [s for s in batched.stages if s.op == "slice"]
    assert len(slices) == 4 and all(s.kind == StageKind.LAYOUT for s in slices)
    offsets = sorted(s.body.index[-1].const for s in slices)
    assert offsets == [0, 16, 32, 48]
    feeds = _inputs(graph, seed=4)
    want, got = run_reference(graph, feeds), run_reference(batched, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def test_different_inputs_or_reduction_sizes_do_not_batch(save_model) -> None:
    # Gates 2 and 3 read a 16-wide slice of x: a different input and reduction, so only 0 and 1 batch.
    graph = _gates_model(save_model, transposed=False, k_sizes=(32, 32, 16, 16))
    batched, decisions = batch_contractions(graph)
    groups = sorted(len(d.stages) for d in decisions if d.batched)
    assert groups == [2, 2]
    feeds = _inputs(graph, seed=5)
    want, got = run_reference(graph, feeds), run_reference(batched, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def test_activation_times_activation_is_refused_with_a_reason(save_model) -> None:
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("MatMul", ["a", "c"], ["q"])]
    graph = helper.make_graph(
        nodes, "aa", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [8, 8]) for n in "abc"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [8, 8]) for n in "pq"])
    g = load_graph(save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)))
    out, decisions = batch_contractions(g)
    assert out is g
    assert len(decisions) == 2 and all(not d.batched for d in decisions)
    assert all("no constant weight" in d.reason for d in decisions)
