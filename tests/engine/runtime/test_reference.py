"""Tests for engine/runtime/reference.py: every sample and the PyTorch-exported fixtures, lowered to
primitive stages and run with NumPy, match onnxruntime (max error ≤ 1e-4 relative to max |output|)."""

from __future__ import annotations

import numpy as np
import pytest
from support import CATALOG, SAMPLES, TEST_DATA, max_rel_error, run_ort, sample_path

from engine.api import load_graph, run_reference
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, Stage, StageKind
from engine.runtime import reference
from engine.runtime.inputs import make_inputs
from engine.runtime.reference import eval_stage

TOL = 1e-4


def _param(name: str):
    slow = CATALOG[name]["category"] == "scale"  # bert12: 12 layers, ~10 s in NumPy
    return pytest.param(name, marks=[pytest.mark.slow] if slow else [])


def check_against(outputs: dict[str, np.ndarray], want: dict[str, np.ndarray], label: str) -> None:
    assert set(outputs) == set(want), label
    for name, arr in want.items():
        got = outputs[name]
        assert got.shape == arr.shape and got.dtype == arr.dtype, (label, name, got.shape, arr.shape)
        err = max_rel_error(got, arr)
        assert err <= TOL, f"{label}:{name} max rel error {err:.2e}"


@pytest.mark.parametrize("name", [_param(n) for n in CATALOG])
def test_sample_matches_onnxruntime(name):
    entry = CATALOG[name]
    graph = load_graph(sample_path(name))
    if entry["io"]:
        io = np.load(SAMPLES / entry["io"])
        feeds = {s.name: io[s.name] for s in graph.inputs}
        want = {o: io[o] for o in graph.output_names}
    else:  # no stored I/O: fixed-seed inputs and onnxruntime live
        feeds = make_inputs(graph, seed=0)
        want = run_ort(sample_path(name), feeds)
    for arr in feeds.values():
        assert np.any(arr != 0)
    check_against(run_reference(graph, feeds), want, name)


TORCH = {"mlp_ln_gelu": (5, 32), "convnet": (3, 3, 16, 16), "attention": (3, 8, 32)}


@pytest.mark.parametrize("name", list(TORCH))
def test_torch_export_matches_onnxruntime(name):
    """TorchScript-exported models (tests/data/torch/export.py) with the dynamic batch bound by shape."""
    path = TEST_DATA / "torch" / f"{name}.onnx"
    graph = load_graph(path, {"x": TORCH[name]})
    assert graph.inputs[0].shape == TORCH[name]
    feeds = make_inputs(graph, seed=3)
    check_against(run_reference(graph, feeds), run_ort(path, feeds), name)


# ---- eval_stage details ---------------------------------------------------------------------


def _matmul_stage(m: int, k: int, n: int) -> Stage:
    body = E.mul(E.Load("A", (I.var("i0"), I.var("r0")), DType.F32), E.Load("B", (I.var("r0"), I.var("i1")), DType.F32))
    return Stage("C", StageKind.CONTRACTION, (m, n), DType.F32, body, (k,), Combine.SUM, op="matmul")


def test_eval_stage_sub_box_and_partial_reduction():
    rng = np.random.default_rng(1)
    env = {"A": rng.standard_normal((6, 5)).astype(np.float32), "B": rng.standard_normal((5, 4)).astype(np.float32)}
    stage = _matmul_stage(6, 5, 4)
    np.testing.assert_allclose(eval_stage(stage, env), env["A"] @ env["B"], rtol=1e-5)
    part = eval_stage(stage, env, {"i0": (2, 5), "i1": (1, 3), "r0": (1, 4)})
    np.testing.assert_allclose(part, env["A"][2:5, 1:4] @ env["B"][1:4, 1:3], rtol=1e-5)


def test_eval_stage_chunks_large_iteration_spaces(monkeypatch):
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 256)
    rng = np.random.default_rng(2)
    n = 40  # i0 x r0 = 1600 points: several chunks
    x = rng.standard_normal((n, n)).astype(np.float32)
    body = E.unary("exp", E.Load("x", (I.var("i0"), I.var("r0")), DType.F32))
    stage = Stage("s", StageKind.REDUCE, (n,), DType.F32, body, (n,), Combine.MAX, op="max")
    np.testing.assert_allclose(eval_stage(stage, {"x": x}), np.exp(x).max(axis=1), rtol=1e-6)


def test_padded_load_and_argmax():
    x = np.array([[3.0, -1.0, 7.0], [0.5, 9.0, 2.0]], np.float32)
    body = E.Load("x", (I.var("i0"), I.var("i1") - 1), DType.F32, pad=-5.0)
    pad = Stage("p", StageKind.LAYOUT, (2, 5), DType.F32, body, op="pad")
    np.testing.assert_array_equal(eval_stage(pad, {"x": x}), [[-5, 3, -1, 7, -5], [-5, 0.5, 9, 2, -5]])
    arg = Stage("a", StageKind.REDUCE, (2,), DType.I64, E.Load("x", (I.var("i0"), I.var("r0")), DType.F32),
                (3,), Combine.ARGMAX, op="argmax")
    np.testing.assert_array_equal(eval_stage(arg, {"x": x}), [2, 1])
