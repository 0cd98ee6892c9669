"""Per-axis thread mappings (Tile.thread_shape, engine/schedule/tiles.py `other_mappings`,
engine/codegen/generate.py `gemm_split` / `thread_splits`): over random GEMMs every offered mapping covers
the tile once, validates, is printed as recorded, and matches numpy on the C backend and under cuda-sim at
the kernel's launch configuration; plans record the mapping that runs; elementwise tiles record none; a
set_tile edit takes one (and refuses an unfit one in one line naming those that fit); a plan file from
before the field loads and means the default."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import test_tile_space as tile_space  # noqa: E402  (its GEMM model and oracle; conftest puts this folder on sys.path)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engine.codegen.generate import gemm_split, generate, micro_tile, thread_splits
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


def _gemm_model(path: Path, m: int, k: int, n: int, epilogue: bool, seed: int) -> Path:
    """y = A @ B (+ bias, relu with `epilogue`): A an input [m, k] (test_tile_space's model, unbatched)."""
    return tile_space._gemm_model(path, m, k, n, 1, epilogue, seed)


_expected = tile_space._expected


def _gemms(program):
    return [p.gemm for kern in program.kernels for s in kern.segments for p in s.phases if p.gemm]


def test_thread_splits_keep_only_mappings_the_model_can_prefer():
    # power-of-two tile and block: one mapping (the square-most) beats the others on every term
    assert thread_splits(64, 64, 256, 64) == [(16, 16)]
    # 99 rows on 256 threads: the default (fewest accumulators, 25 x 1) loads 26 operands per k; 7 x 4
    # holds 28 accumulators and loads 11 — a trade the model prices (registers against shared loads)
    got = thread_splits(99, 64, 256, 64)
    tm, tn, tx, ty = micro_tile(99, 64, 256)
    assert got[0] == (ty, tx) and (16, 16) in got
    for ty, tx in got:
        tm, tn, _, _ = gemm_split(99, 64, 256, (ty, tx))
        assert ty * tx == 256 and tx & (tx - 1) == 0 and tm * tn <= 64 and tm * ty >= 99 and tn * tx >= 64
    # budget: no mapping over the accumulators offered beside the default
    assert all(math.prod(gemm_split(197, 64, 64, m)[:2]) <= 64 for m in thread_splits(197, 64, 64, 64)[1:])


odd = st.integers(3, 40).map(lambda v: 2 * v + 1)  # 7 .. 81, odd


GEMMS = dict(m=odd, k=st.integers(5, 70), n=odd, epilogue=st.booleans(), device=st.sampled_from(["a100", "h100"]),
             data=st.data())


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**GEMMS)
def test_offered_mappings_cover_validate_print_and_run(m, k, n, epilogue, device, data):
    _check_mappings(m, k, n, epilogue, device, data)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**GEMMS)
def test_many_mapped_gemms(m, k, n, epilogue, device, data):
    _check_mappings(m, k, n, epilogue, device, data)


def _check_mappings(m, k, n, epilogue, device, data):
    dev = get_device(device)
    with tempfile.TemporaryDirectory() as tmp, Caches("thread-map").active():
        path = _gemm_model(Path(tmp) / "g.onnx", m, k, n, epilogue, seed=m * n + k)
        graph, plan = plan_model(load_graph(path), "welder", dev)
        conns = {e.key: e.conn for e in plan.edges}
        (group,) = [g for g in plan.groups if "mm" in g.stages or "y" in g.stages and graph.stage("y").reduce]
        segs = segments_of(graph, group.stages, conns)
        (at,) = [i for i, sg in enumerate(segs) if any(graph.stage(x).reduce for x in sg)]
        seg = segs[at]
        anchor = segment_sinks(graph, seg, conns)[-1]
        # the plan records the mapping its kernel runs
        program = generate(plan, graph, dev, target="cuda")
        chosen = group.segments[at]
        printed = {(g.ty, g.tx) for g in _gemms(program)}
        assert (chosen.thread_shape,) == tuple(printed) or (not printed and not chosen.thread_shape)
        pool = tiles.candidate_tiles(graph, seg, anchor, dev, "welder")
        mapped = [t for t in pool if t.thread_shape]
        event(f"mappings offered: {'some' if mapped else 'none'}")
        acc = micro_budget(dev).accumulators
        valid = []
        for t in mapped:
            ty, tx = t.thread_shape
            bm, bn = math.prod(t.shape[:-1]), t.shape[-1]
            tm, tn, _, _ = gemm_split(bm, bn, t.threads, t.thread_shape)
            # the threads cover the tile once: ty x tx threads, each a tm x tn micro-tile, no row or column twice
            assert ty * tx == t.threads and tm * ty >= bm > (tm - 1) * ty and tn * tx >= bn > (tn - 1) * tx
            assert tm * tn <= acc
            bad = check_group(graph, group.stages, conns, [t], dev, segs=[seg])
            # the one rule an offered mapping may break (the search then skips it, as it does any tile):
            # its padded micro-tiles' wasted work over the plan's recompute bound, on a tile the threads
            # fill only in part
            assert all(v.rule == "recompute" and "fills only in part" in v.message for v in bad), (t, bad)
            if not bad:
                valid.append(t)
        event(f"valid mappings offered: {'some' if valid else 'none'}")
        if not valid:
            return
        tile = data.draw(st.sampled_from(valid), label="mapped candidate")
        edited = dataclasses.replace(plan, groups=tuple(
            dataclasses.replace(g, segments=tuple(tile if i == at else t for i, t in enumerate(g.segments)))
            if g is group else g for g in plan.groups))
        # (the C target of a GPU plan runs coarsened tiles, each at its own default mapping: coarsen_for_c)
        for target in ("c", "cuda") if dev.kind == "cpu" else ("cuda",):
            gemms = _gemms(generate(edited, graph, dev, target=target))
            assert gemms and all((g.ty, g.tx) == tile.thread_shape for g in gemms), (target, tile)
        x = np.random.default_rng(m + k + n).standard_normal((m, k)).astype(np.float32)
        want = _expected(path, x)
        for backend in ("cpu", "cuda-sim"):
            result = run_model(graph, {"a": x}, backend=backend, plan=edited, device=device)
            assert np.abs(result.outputs["y"] - want).max() <= TOL * max(1.0, np.abs(want).max()), (backend, tile)
            if backend == "cuda-sim":
                assert result.sim.ok, "\n".join(result.sim.summary_lines())


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.lists(st.integers(2, 70), min_size=1, max_size=3), device=st.sampled_from(["host", "a100"]))
def test_elementwise_tiles_record_no_mapping(shape, device):
    """An elementwise tile's threads run one flat row-major loop over it (consecutive threads on consecutive
    innermost elements: every access coalesced as it can be), so no mapping is offered or recorded."""
    dev = get_device(device)
    with tempfile.TemporaryDirectory() as tmp, Caches("thread-map-ew").active():
        nodes = [helper.make_node("Relu", ["a"], ["r"], name="relu"), helper.make_node("Mul", ["r", "a"], ["y"], name="mul")]
        g = helper.make_graph(nodes, "ew", [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
        path = Path(tmp) / "e.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
        graph, plan = plan_model(load_graph(path), "welder", dev)
        assert all(not t.thread_shape for g in plan.groups for t in g.segments)
        for g in plan.groups:
            anchor = g.segments[-1].stage
            assert all(not t.thread_shape for t in tiles.candidate_tiles(graph, list(g.stages), anchor, dev, "welder"))
        x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
        got = run_model(graph, {"a": x}, backend="cpu", plan=plan, device=device).outputs["y"]
        assert np.allclose(got, np.maximum(x, 0) * x, atol=1e-6)


def test_set_tile_takes_a_mapping_and_refuses_one_that_does_not_fit(tmp_path):
    dev = get_device("a100")
    graph, plan = plan_model(load_graph(_gemm_model(tmp_path / "g.onnx", 99, 64, 64, True, 3)), "welder", dev)
    edit = Edit.make("set_tile", stage="y", shape=[99, 64], threads=256, thread_shape=[16, 16])
    edited = apply_edit(plan, graph, dev, edit)
    (tile,) = [t for g in edited.groups for t in g.segments if t.stage == "y"]
    assert tile.thread_shape == (16, 16)
    (g,) = _gemms(generate(edited, graph, dev, target="cuda"))
    assert (g.ty, g.tx, g.tm, g.tn) == (16, 16, 7, 4)
    # the default mapping of this tile is another one: the edit is what changed the printed kernel
    assert micro_tile(99, 64, 256)[2:] != (16, 16)
    # searched beside the default on a GPU; not on the host CPU, whose C micro-kernel ignores the mapping
    seg = ["mm", "sum", "y"]
    assert (16, 16) in tiles.other_mappings(graph, seg, graph.stage("y"), (99, 64), 256, (), dev)
    assert tiles.other_mappings(graph, seg, graph.stage("y"), (99, 64), 256, (), get_device("host")) == []
    x = np.random.default_rng(5).standard_normal((99, 64)).astype(np.float32)
    got = run_model(graph, {"a": x}, backend="cpu", plan=edited, device="a100").outputs["y"]
    assert np.abs(got - _expected(tmp_path / "g.onnx", x)).max() <= TOL * 10
    for bad in ([3, 85], [16, 8], [16]):  # tx not a power of two; 128 threads, not 256; one axis
        with pytest.raises(PlanError, match="mappings that fit: .*16x16") as err:
            apply_edit(plan, graph, dev, Edit.make("set_tile", stage="y", shape=[99, 64], threads=256,
                                                   thread_shape=bad))
        assert "\n" not in str(err.value)
    # 32 threads over 99 x 64: every mapping needs more than the 128 accumulators a thread may hold
    with pytest.raises(PlanError, match="at most 128 accumulators.*fit: none"):
        apply_edit(plan, graph, dev, Edit.make("set_tile", stage="y", shape=[99, 64], threads=32, thread_shape=[4, 8]))
    with pytest.raises(PlanError, match="thread_shape"):
        apply_edit(plan, graph, dev, Edit.make("set_tile", stage="y", shape=[99, 64], threads=256, thread_shape=["x"]))
    back = plan_from_json(json.loads(json.dumps(plan_to_json(edited))), graph)
    assert back == edited


def test_a_plan_file_without_mappings_loads_and_runs_the_default(tmp_path):
    """Plan files from before Tile.thread_shape: no key on any tile; they load, and codegen runs the
    default mapping (`micro_tile`) for them."""
    dev = get_device("a100")
    path = _gemm_model(tmp_path / "g.onnx", 99, 64, 64, False, 4)
    graph, plan = plan_model(load_graph(path), "welder", dev)
    assert any(t.thread_shape for g in plan.groups for t in g.segments)  # new plans say it
    data = plan_to_json(plan)
    for g in data["groups"]:
        for t in g["segments"] + [c["tile"] for c in g["candidates"]]:
            del t["thread_shape"]
    old = plan_from_json(json.loads(json.dumps(data)), graph)
    assert all(not t.thread_shape for g in old.groups for t in g.segments)
    for g_old, g_new in zip(_gemms(generate(old, graph, dev)), _gemms(generate(plan, graph, dev))):
        assert (g_old.ty, g_old.tx) == micro_tile(g_old.bm, g_old.bn, old.groups[0].threads)[:1:-1]
        assert (g_old.tm, g_old.tn, g_old.tx, g_old.ty) == (g_new.tm, g_new.tn, g_new.tx, g_new.ty)
    x = np.random.default_rng(6).standard_normal((99, 64)).astype(np.float32)
    got = run_model(graph, {"a": x}, backend="cpu", plan=old, device="a100").outputs["y"]
    assert np.abs(got - _expected(path, x)).max() <= TOL * 10
