"""The tile space beyond powers of two (engine/schedule/tiles.py: `_extents`, `reduce_steps`): over
random odd GEMM shapes every candidate tile covers its stage exactly once, is accepted by validate, and
is printed as recorded (block tile and k step: codegen rounds none back to a power of two); the new
candidates' C matches numpy on random inputs; a plan edit with a reduce step round-trips through JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engine.codegen.generate import generate
from engine.codegen.micro import micro_budget
from engine.device import get_device
from engine.errors import PlanError
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.runtime.execute import run_model
from engine.schedule import tiles
from engine.schedule.edits import apply_edit
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import Edit, plan_from_json, plan_to_json
from engine.schedule.validate import check_group
from engine.tilegraph.tilegraph import segment_sinks, segments_of

TOL = 1e-4


def _gemm_model(path: Path, m: int, k: int, n: int, batch: int, epilogue: bool, seed: int) -> Path:
    """y = A @ B (+ bias, relu with `epilogue`): A an input [batch?, m, k], B and bias random constants."""
    rng = np.random.default_rng(seed)
    a_shape = [batch, m, k] if batch > 1 else [m, k]
    nodes = [helper.make_node("MatMul", ["a", "B"], ["mm" if epilogue else "y"], name="mm")]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "B")]
    if epilogue:
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        nodes += [helper.make_node("Add", ["mm", "bias"], ["sum"], name="add"),
                  helper.make_node("Relu", ["sum"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*a_shape[:-1], n])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _expected(path: Path, x: np.ndarray) -> np.ndarray:
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    y = x @ inits["B"]
    return np.maximum(y + inits["bias"], 0) if "bias" in inits else y


def _is_new(stage, t) -> bool:
    """A candidate outside the old space: a non-power-of-two extent short of the axis, or a k step
    other than the default."""
    odd = any(x & (x - 1) and x != n for x, n in zip(t.shape, stage.shape))
    default = tuple(min(32, r) for r in stage.reduce) if stage.reduce else ()
    return odd or t.reduce_step != default


def _covers_once(shape, t) -> bool:
    """The grid of `t` over `shape`: every element in exactly one block's box."""
    counts = [-(-n // x) for n, x in zip(shape, t.shape)]
    if math.prod(counts) * t.row_split != t.blocks:
        return False
    seen = np.zeros(shape, dtype=np.int64)
    for idx in np.ndindex(*counts):
        seen[tuple(slice(i * x, min((i + 1) * x, n)) for i, x, n in zip(idx, t.shape, shape))] += 1
    return bool((seen == 1).all())


odd = st.integers(3, 120).map(lambda v: 2 * v + 1)  # 7 .. 241, odd (197 among them)


ODD_GEMMS = dict(m=odd, k=st.integers(5, 300), n=odd, batch=st.sampled_from([1, 3]), epilogue=st.booleans(),
                 device=st.sampled_from(["host", "a100"]), data=st.data())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**ODD_GEMMS)
def test_candidates_on_odd_shapes_cover_validate_and_print_as_recorded(m, k, n, batch, epilogue, device, data):
    _check_odd_gemm(m, k, n, batch, epilogue, device, data)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**ODD_GEMMS)
def test_many_odd_shapes(m, k, n, batch, epilogue, device, data):
    _check_odd_gemm(m, k, n, batch, epilogue, device, data)


def _check_odd_gemm(m, k, n, batch, epilogue, device, data):
    dev = get_device(device)
    with tempfile.TemporaryDirectory() as tmp, Caches("tile-space").active():
        path = _gemm_model(Path(tmp) / "g.onnx", m, k, n, batch, epilogue, seed=m * n + k)
        graph, plan = plan_model(load_graph(path), "welder", dev)
        conns = {e.key: e.conn for e in plan.edges}
        (group,) = [g for g in plan.groups if "mm" in g.stages or any(graph.stage(s).reduce for s in g.stages)]
        # The contraction's segment (welder may put the epilogue behind a grid barrier in the same kernel).
        segs = segments_of(graph, group.stages, conns)
        (at,) = [i for i, sg in enumerate(segs) if any(graph.stage(x).reduce for x in sg)]
        seg = segs[at]
        anchor = segment_sinks(graph, seg, conns)[-1]
        stage = graph.stage(anchor)
        pool = tiles.candidate_tiles(graph, seg, anchor, dev, "welder")
        budget = micro_budget(dev)
        # The search validates what it is offered and skips what fails (a row-split tile of a 7x7 GEMM with
        # its epilogue on 32 threads recomputes 2.2x, over the bound): a candidate need not validate, but
        # the plan's own tile does, and every candidate drawn below is one that validates.
        valid = [t for t in pool if not check_group(graph, group.stages, conns, [t], dev, segs=[seg])]
        assert group.segments[at] in valid or group.segments[at] not in pool
        assert valid
        new = [t for t in valid if _is_new(stage, t)]
        for t in pool:
            assert _covers_once(stage.shape, t), t
            if t.reduce_step:  # recorded steps fit the staging budget: codegen prints them unhalved
                assert all(s >= 1 for s in t.reduce_step)
        assert len(pool) == len({(t.shape, t.threads, t.reduce_step, t.threads_per_row, t.thread_shape) for t in pool})
        event(f"new candidates: {'some' if new else 'none'}")
        if not new:
            return
        tile = data.draw(st.sampled_from(new), label="new candidate")
        event(f"ran: {'k step' if tile.reduce_step != pool[0].reduce_step else 'odd extent'}")
        edited = dataclasses.replace(plan, groups=tuple(
            dataclasses.replace(g, segments=tuple(tile if i == at else t for i, t in enumerate(g.segments)))
            if g is group else g for g in plan.groups))
        program = generate(edited, graph, dev, target="cuda")
        gemms = [p.gemm for kern in program.kernels for s in kern.segments for p in s.phases if p.gemm]
        ktot = k
        for g in gemms:  # the block tile and k step as the plan records them
            assert (g.bm, g.bn) == (tile.shape[-2], tile.shape[-1])
            want = math.prod(tile.reduce_step) if tile.reduce_step else 32
            assert g.bk == min(want, ktot), (g.bk, tile)
            assert 4 * g.bk * (g.ty * g.tm + g.tx * g.tn) <= budget.stage_bytes or not tile.reduce_step
        x = np.random.default_rng(m + k + n).standard_normal((batch, m, k) if batch > 1 else (m, k)).astype(np.float32)
        got = run_model(graph, {"a": x}, backend="cpu", plan=edited, device=device).outputs["y"]
        want = _expected(path, x)
        assert np.abs(got - want).max() <= TOL * max(1.0, np.abs(want).max()), tile


def test_extents_cover_an_odd_axis_with_less_padding():
    got = tiles._extents(197, {1, 2, 4, 8, 16, 32, 64, 128, 197})
    assert {99, 50} <= set(got) and 29 not in got  # 7 tiles of 32 pad 224, of 29 203: under PAD_CUT
    assert tiles._extents(65, {32, 64, 65}, 8) == [24, 32, 40, 64, 65]  # 3 x 24 = 72, 2 x 40 = 80 (96, 128)
    assert tiles._extents(197, {32, 64, 128, 197}, 8) == [32, 64, 128, 197]  # 2 x 104 = 208: under a fifth
    assert tiles._extents(256, {32, 64, 128, 256}) == [32, 64, 128, 256]  # powers of two divide it: nothing new


@given(n=st.integers(2, 5000), align=st.sampled_from([1, 8]))
def test_every_added_extent_cuts_padding(n, align):
    base = {x for x in (1, 2, 4, 8, 16, 32, 64, 128, 256) if x <= n} | {n}
    got = tiles._extents(n, base, align)
    assert base <= set(got) and all(1 <= b <= n for b in got)
    for b in set(got) - base:
        assert b % align == 0
        assert any(-(-n // b) * b <= (1 - tiles.PAD_CUT) * -(-n // t) * t for t in base if t > b)


@pytest.mark.parametrize("device", ["host", "a100"])
def test_reduce_steps_cut_padded_k(device, tmp_path):
    """k = 197 (tokens): the step of 8 and the whole reduction pad less than 32 (224), the whole one only
    where its staging fits; k = 768 (a multiple of 32): the default alone; an epilogue anchor records the
    inlined contraction's step as (s,)."""
    dev = get_device(device)
    graph = load_graph(_gemm_model(tmp_path / "g.onnx", 65, 197, 64, 1, False, 0))
    stage = graph.stage("y")
    assert tiles.reduce_steps(graph, ["y"], stage, (16, 32), 64, dev) == [(32,), (8,), (197,)]
    assert tiles.reduce_steps(graph, ["y"], stage, (32, 64), 256, dev) == [(32,), (8,)]  # 197 steps: 75 KB
    graph = load_graph(_gemm_model(tmp_path / "e.onnx", 65, 197, 64, 1, True, 0))
    assert tiles.reduce_steps(graph, ["mm", "sum", "y"], graph.stage("y"), (16, 32), 64, dev) == [(), (8,), (197,)]
    graph = load_graph(_gemm_model(tmp_path / "h.onnx", 65, 768, 64, 1, True, 0))
    assert tiles.reduce_steps(graph, ["mm", "sum", "y"], graph.stage("y"), (16, 32), 64, dev) == [()]


def test_plan_edit_with_a_reduce_step_round_trips_through_json(tmp_path):
    dev = get_device("a100")
    graph, plan = plan_model(load_graph(_gemm_model(tmp_path / "g.onnx", 197, 197, 64, 1, True, 1)), "welder", dev)
    edit = Edit.make("set_tile", stage="y", shape=[13, 32], threads=64, reduce_step=[197])  # staging 38 KB
    edited = apply_edit(plan, graph, dev, edit)
    (tile,) = [t for g in edited.groups for t in g.segments if t.stage == "y"]
    assert (tile.shape, tile.reduce_step) == ((13, 32), (197,))
    back = plan_from_json(json.loads(json.dumps(plan_to_json(edited))), graph)
    assert back == edited
    program = generate(back, graph, dev)
    (g,) = [p.gemm for kern in program.kernels for s in kern.segments for p in s.phases if p.gemm]
    assert (g.bm, g.bn, g.bk) == (13, 32, 197)
    with pytest.raises(PlanError, match="reduce_step"):
        apply_edit(plan, graph, dev, Edit.make("set_tile", stage="y", shape=[99, 64], threads=256, reduce_step=[0]))


def test_a_k_step_over_the_staging_budget_is_refused_not_halved(tmp_path):
    """The plan must say what runs: a user's k step whose staging codegen would halve is refused in one line,
    naming the largest that fits; that step is accepted and printed as given."""
    dev = get_device("a100")
    graph, plan = plan_model(load_graph(_gemm_model(tmp_path / "g.onnx", 197, 197, 64, 1, True, 1)), "welder", dev)
    limit = tiles.staging_limit((128, 64), 256, dev)
    assert 4 < limit < 197
    with pytest.raises(PlanError, match=f"at most {limit}") as err:
        apply_edit(plan, graph, dev, Edit.make("set_tile", stage="y", shape=[128, 64], threads=256, reduce_step=[197]))
    assert "\n" not in str(err.value) and "would halve" in str(err.value)
    fits = max(s for s in (8, 16, 32, 64, 128) if s <= limit)
    edited = apply_edit(plan, graph, dev, Edit.make("set_tile", stage="y", shape=[128, 64], threads=256,
                                                    reduce_step=[fits]))
    program = generate(edited, graph, dev)
    (g,) = [p.gemm for kern in program.kernels for s in kern.segments for p in s.phases if p.gemm]
    assert (g.bm, g.bn, g.bk) == (128, 64, fits)


def test_a_candidate_validation_refuses_is_skipped_not_planned():
    """7x7 GEMM (k 33) with its epilogue on the host: one offered row-split tile recomputes 2.2x, over the
    bound. The search skips it; the plan validates."""
    from engine.schedule.validate import validate

    dev = get_device("host")
    with tempfile.TemporaryDirectory() as tmp:
        path = _gemm_model(Path(tmp) / "g.onnx", 7, 33, 7, 1, True, seed=7 * 7 + 33)
        graph, plan = plan_model(load_graph(path), "welder", dev)
        conns = {e.key: e.conn for e in plan.edges}
        (group,) = [g for g in plan.groups if "mm" in g.stages]
        segs = segments_of(graph, group.stages, conns)
        (at,) = [i for i, sg in enumerate(segs) if any(graph.stage(x).reduce for x in sg)]
        anchor = segment_sinks(graph, segs[at], conns)[-1]
        pool = tiles.candidate_tiles(graph, segs[at], anchor, dev, "welder")
        refused = [t for t in pool if check_group(graph, group.stages, conns, [t], dev, segs=[segs[at]])]
        assert refused and len(refused) < len(pool)
        assert validate(plan, graph, dev) == []
