"""Tile searches that cost the same kernel twice are made once:
- on a CPU device a segment without a contraction prints the same C whatever its tile's threads and lanes
  per row, so its candidate pool holds one tile per shape (`tiles._one_per_code`); a GPU's pool keeps them;
- the stitch policy's searches share the other modes' where its pool adds no split rows (`tiles.splits_rows`),
  and search apart where it does."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.codegen.generate import generate
from engine.codegen.targets import render_c
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.ir.graph import StageKind
from engine.memo import Caches
from engine.schedule import tiles
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import Conn

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


def _c_without_comments(plan, graph, device) -> str:
    return re.sub(r"//[^\n]*", "", render_c(generate(plan, graph, device, target="c")))


def _varied(plan, gi: int, si: int, tile):
    group = plan.groups[gi]
    segs = list(group.segments)
    segs[si] = tile
    groups = list(plan.groups)
    groups[gi] = dataclasses.replace(group, segments=tuple(segs))
    return dataclasses.replace(plan, groups=tuple(groups))


@pytest.mark.parametrize("name", ["masked_softmax", "layernorm_residual"])
def test_a_cpu_pool_holds_one_tile_per_printed_kernel(name):
    host, gpu = get_device("host"), get_device("a100")
    compared = 0
    with Caches("cpu-pool").active():
        graph, plan = plan_model(load_graph(SAMPLES / f"{name}.onnx"), "stitch", host)
        for gi, group in enumerate(plan.groups):
            kinds = {graph.stage(s).kind for s in group.stages}
            if StageKind.CONTRACTION in kinds or len(group.segments) != 1:
                continue
            anchor = group.segments[0].stage
            pool = tiles.candidate_tiles(graph, list(group.stages), anchor, host, "stitch")
            keys = [(t.shape, t.reduce_step, t.row_split, t.thread_shape) for t in pool]
            assert len(keys) == len(set(keys)), pool
            gpu_pool = tiles.candidate_tiles(graph, list(group.stages), anchor, gpu, "stitch")
            assert len(gpu_pool) > len({(t.shape, t.reduce_step, t.row_split) for t in gpu_pool})  # a GPU keeps them
            # What the CPU pool leaves out prints the same C as the tile it keeps of that shape.
            full = tiles._tile_pool(graph, list(group.stages), anchor, host, "stitch", kinds)
            for kept in pool[:4]:
                others = [t for t in full if t.shape == kept.shape and t != kept][:2]
                printed = _c_without_comments(_varied(plan, gi, 0, kept), graph, host) if others else None
                for other in others:
                    assert _c_without_comments(_varied(plan, gi, 0, other), graph, host) == printed, (group.name, kept, other)
                    compared += 1
    assert compared > 0  # not vacuous: the full pool had thread variants to drop


def _split_rows_model(path: Path) -> None:
    """x[4, 8192] -> ReduceSum over the rows -> * s: four long rows, fewer than an a100's SMs."""
    s = numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 1)).astype(np.float32), "s")
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["r"], name="r", keepdims=1),
             helper.make_node("Mul", ["r", "s"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8192])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1])], [s, axes])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def _passes(monkeypatch) -> list:
    made: list = []
    inner = tiles._search_pass

    def counted(*args, **kwargs):
        made.append(args[1])
        return inner(*args, **kwargs)

    monkeypatch.setattr(tiles, "_search_pass", counted)
    return made


def test_stitch_shares_searches_unless_its_pool_splits_rows(monkeypatch):
    made = _passes(monkeypatch)
    a100 = get_device("a100")
    with Caches("share").active():
        graph, _ = plan_model(load_graph(SAMPLES / "masked_softmax.onnx"), "unfused", a100)
        stages = [graph.stages[0].name]
        conns = {e: Conn.KERNEL for e in graph.edges}
        assert not any(tiles.splits_rows(graph.stage(s), a100) for s in stages)
        tiles.search_group(graph, stages, conns, a100, "welder")
        before = len(made)
        tiles.search_group(graph, stages, conns, a100, "stitch")
        assert len(made) == before  # answered from the welder search's cache
    with tempfile.TemporaryDirectory() as tmp, Caches("split").active():
        _split_rows_model(Path(tmp) / "rows.onnx")
        graph, _ = plan_model(load_graph(Path(tmp) / "rows.onnx"), "unfused", a100)
        reduce = next(s.name for s in graph.stages if s.kind == StageKind.REDUCE)
        assert tiles.splits_rows(graph.stage(reduce), a100)
        conns = {e: Conn.KERNEL for e in graph.edges}
        welder = tiles.search_group(graph, [reduce], conns, a100, "welder")
        before = len(made)
        stitch = tiles.search_group(graph, [reduce], conns, a100, "stitch")
        assert len(made) > before  # a pool of its own: searched again
        pool = tiles.candidate_tiles(graph, [reduce], reduce, a100, "stitch")
        assert any(t.row_split > 1 for t in pool)
        assert all(t.row_split == 1 for t in tiles.candidate_tiles(graph, [reduce], reduce, a100, "welder"))
        assert welder.tiles and stitch.tiles
