"""Tests for engine/ir/passes.py: CSE, dead-stage removal, constant folding and view inlining, each
checked structurally and by reference outputs before and after."""

from __future__ import annotations

import numpy as np

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, PrimGraph, Stage, StageKind, TensorSpec
from engine.ir.passes import eliminate_common, fold_constants, inline_views, remove_dead, run_default_passes
from engine.runtime.inputs import make_inputs
from engine.runtime.reference import run_reference

F32 = DType.F32
i0, i1 = I.out_vars(2)


def ld(name: str, *index) -> E.Load:
    return E.Load(name, tuple(I.as_lin(i) for i in index), F32)


def ew(name: str, body: E.Expr, shape=(3, 4)) -> Stage:
    return Stage(name, StageKind.ELEMENTWISE, shape, F32, body, op=name)


def graph(stages, outputs, constants=(), weights=None) -> PrimGraph:
    return PrimGraph("g", (TensorSpec("x", (3, 4), F32),), tuple(constants), tuple(stages), tuple(outputs),
                     weights=weights or {})


def same_outputs(a: PrimGraph, b: PrimGraph) -> None:
    feeds = make_inputs(a, seed=7)
    want, got = run_reference(a, feeds), run_reference(b, feeds)
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6)


def test_cse_merges_duplicate_stages():
    e1 = ew("e1", E.unary("exp", ld("x", i0, i1)))
    e2 = ew("e2", E.unary("exp", ld("x", i0, i1)))
    out = ew("out", E.add(ld("e1", i0, i1), ld("e2", i0, i1)))
    g = graph([e1, e2, out], ["out"])
    cse = remove_dead(eliminate_common(g))
    assert [s.name for s in cse.stages] == ["e1", "out"]
    assert cse.stage("out").inputs == ("e1",)
    same_outputs(g, cse)


def test_cse_keeps_graph_outputs():
    e1 = ew("e1", E.unary("exp", ld("x", i0, i1)))
    e2 = ew("e2", E.unary("exp", ld("x", i0, i1)))
    assert [s.name for s in eliminate_common(graph([e1, e2], ["e1", "e2"])).stages] == ["e1", "e2"]


def test_dead_stages_and_constants_removed():
    w = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    live = ew("live", E.mul(ld("x", i0, i1), E.imm(2.0)))
    dead = ew("dead", E.add(ld("x", i0, i1), ld("w", i0, i1)))
    g = graph([live, dead], ["live"], [TensorSpec("w", (3, 4), F32)], {"w": w})
    out = remove_dead(g)
    assert [s.name for s in out.stages] == ["live"] and out.constants == () and not out.weights


def test_constant_folding_evaluates_constant_stages():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    wt = Stage("wt", StageKind.LAYOUT, (3, 4), F32, ld("w", i1, i0), op="transpose")
    scaled = ew("scaled", E.mul(ld("wt", i0, i1), E.imm(3.0)))
    out = ew("out", E.add(ld("x", i0, i1), ld("scaled", i0, i1)))
    g = graph([wt, scaled, out], ["out"], [TensorSpec("w", (4, 3), F32)], {"w": w})
    folded = remove_dead(fold_constants(g))
    assert [s.name for s in folded.stages] == ["out"]
    np.testing.assert_allclose(folded.weights["scaled"], w.T * 3, rtol=1e-6)
    same_outputs(g, folded)


def test_inline_views_removes_transpose_and_reshape_copies():
    # t = transpose(x) [4,3]; r = reshape(t) [2,2,3]; out[0, j] = sum_k r[0,k,j] * r[1,k,j]
    t = Stage("t", StageKind.LAYOUT, (4, 3), F32, ld("x", i1, i0), op="transpose")
    r0, r1, r2 = I.out_vars(3)
    r = Stage("r", StageKind.LAYOUT, (2, 2, 3), F32, ld("t", r0 * 2 + r1, r2), op="reshape")
    k = I.var("r0")
    body = E.mul(E.Load("r", (I.const(0), k, i1), F32), E.Load("r", (I.const(1), k, i1), F32))
    red = Stage("out", StageKind.CONTRACTION, (1, 3), F32, body, (2,), Combine.SUM, op="dot")
    g = graph([t, r, red], ["out"])
    inlined = inline_views(g)
    assert [s.name for s in inlined.stages] == ["out"]
    assert inlined.stage("out").inputs == ("x",)
    assert all(ix.is_affine for n in E.walk(inlined.stage("out").body) if isinstance(n, E.Load) for ix in n.index)
    same_outputs(g, inlined)


def test_default_passes_keep_reference_outputs():
    t = Stage("t", StageKind.LAYOUT, (4, 3), F32, ld("x", i1, i0), op="transpose")
    a = ew("a", E.unary("tanh", ld("t", i1, i0)))
    b = ew("b", E.unary("tanh", ld("t", i1, i0)))
    out = ew("out", E.sub(ld("a", i0, i1), E.mul(ld("b", i0, i1), E.imm(0.5))))
    g = graph([t, a, b, out], ["out"])
    opt = run_default_passes(g)
    assert len(opt.stages) == 2 and "t" not in opt.stage_map
    same_outputs(g, opt)
