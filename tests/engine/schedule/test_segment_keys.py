"""Memo keys of one segment's builds (sched3 branch) hold the connections of the edges inside the segment,
not those leaving it (`tilegraph.inner_edges`):
- what the keys leave out is read by nobody: a segment's use, floor recipe and tile check computed
  afresh come out equal when every edge leaving the segment changes level (kernel <-> global_sync);
- a memo filled under one connection set answers a changed outside edge from the table (a hit) with what a
  fresh computation gives, and misses for a changed inside edge (register <-> shared), again equal to a
  fresh computation (and differing from the first answer for some segment: not vacuous);
- the tile check's key keeps the anchor's outgoing edges (the row-split rule reads them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.ir.graph import StageKind
from engine.memo import Caches
from engine.schedule import cost, floor, validate
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import Conn
from engine.schedule.tiles import make_tile
from engine.tilegraph.tilegraph import inner_edges, segments_of

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
CASES = [("bert_layer", "a100"), ("conv_bn_relu", "host"), ("zoo/decoder_kv", "a100"), ("mobilenetv2_block", "v100")]
_FLIP = {Conn.KERNEL: Conn.GLOBAL_SYNC, Conn.GLOBAL_SYNC: Conn.KERNEL}


def _plan(name: str, device: str):
    dev = get_device(device)
    with Caches("plan").active():
        graph, plan = plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", dev)
    return graph, plan, dev, {e.key: e.conn for e in plan.edges}


def _segments(graph, plan, conns):
    """(segment, its tile) of every kernel of the plan."""
    for group in plan.groups:
        yield from zip(segments_of(graph, group.stages, conns), group.segments)


def _flip_out(graph, seg, conns, keep_anchor: str | None = None) -> tuple[dict, int]:
    """`conns` with every edge leaving `seg` at the other of kernel / global_sync (those out of
    `keep_anchor` left as they are), and how many changed."""
    members, out, n = set(seg), dict(conns), 0
    for p in seg:
        for c in graph.consumers.get(p, ()):
            if c not in members and p != keep_anchor:
                out[(p, c)] = _FLIP[out.get((p, c), Conn.KERNEL)]
                n += 1
    return out, n


def _fresh(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` on memo tables of its own (nothing found from earlier calls)."""
    with Caches("fresh").active():
        return fn(*args, **kwargs)


@pytest.mark.parametrize(("name", "device"), CASES)
def test_outside_edges_change_nothing_the_keys_leave_out(name, device):
    graph, plan, dev, conns = _plan(name, device)
    changed = 0
    for seg, tile in _segments(graph, plan, conns):
        flipped, _ = _flip_out(graph, seg, conns, keep_anchor=tile.stage)
        for exact in (False, True):
            assert _fresh(cost.segment_use, graph, seg, conns, tile, exact=exact, device=dev) == _fresh(cost.segment_use, graph, seg, flipped, tile, exact=exact, device=dev), (seg, exact)
        assert _fresh(floor._recipe, graph, seg, conns, tile.stage) == _fresh(floor._recipe, graph, seg, flipped, tile.stage), seg
        assert _fresh(validate._check_tile, graph, seg, conns, tile, dev, "g") == _fresh(validate._check_tile, graph, seg, flipped, tile, dev, "g"), seg
        full, n = _flip_out(graph, seg, conns)  # the anchor's edges too: the use and the recipe still agree
        changed += n
        assert _fresh(cost.segment_use, graph, seg, conns, tile, device=dev) == _fresh(cost.segment_use, graph, seg, full, tile, device=dev), seg
        assert _fresh(floor._recipe, graph, seg, conns, tile.stage) == _fresh(floor._recipe, graph, seg, full, tile.stage), seg
        if tile.row_split == 1:  # the row-split rule is the one reader of the anchor's outgoing edges
            assert _fresh(validate._check_tile, graph, seg, conns, tile, dev, "g") == _fresh(validate._check_tile, graph, seg, full, tile, dev, "g"), seg
    assert changed > 0  # some segment had an edge leaving it


@pytest.mark.parametrize(("name", "device"), CASES[:2])
def test_memo_hits_for_an_outside_edge_and_misses_for_an_inside_one(name, device):
    graph, plan, dev, conns = _plan(name, device)
    differed = 0
    for seg, tile in _segments(graph, plan, conns):
        inner = [(p, c) for p, c, conn in inner_edges(graph, seg, conns) if conn in ("register", "shared")]
        with Caches("walk").active() as caches:
            first = cost.segment_use(graph, seg, conns, tile, device=dev)
            flipped, n = _flip_out(graph, seg, conns)
            hits = caches.stats()["cost.segment_use"]["hits"]
            again = cost.segment_use(graph, seg, flipped, tile, device=dev)
            assert again == first
            if n:
                assert caches.stats()["cost.segment_use"]["hits"] == hits + 1  # from the table
            for edge in inner:
                other = dict(conns)
                other[edge] = Conn.SHARED if conns[edge] == Conn.REGISTER else Conn.REGISTER
                got = cost.segment_use(graph, seg, other, tile, device=dev)
                assert got == _fresh(cost.segment_use, graph, seg, other, tile, device=dev), (seg, edge)
                assert validate._checked_tile(graph, seg, other, tile, dev, "g") == _fresh(validate._check_tile, graph, seg, other, tile, dev, "g"), (seg, edge)
                differed += got != first
    assert differed > 0  # an inside edge's level shows in some segment's use: the test can fail


def test_tile_check_key_keeps_the_anchors_outgoing_edges(attn_graph):
    """A reduction's rows split across blocks are legal only behind grid barriers to all its consumers:
    the memoised check must not answer one connection set with the other's verdict."""
    graph, dev = attn_graph, get_device("a100")
    red = next(s for s in graph.stages if s.kind == StageKind.REDUCE and graph.consumers.get(s.name)
               and s.name not in graph.outputs)
    tile = make_tile(red, (1,) * len(red.shape), 256, threads_per_row=256, row_split=2)
    seg = [red.name]
    barrier = {(red.name, c): Conn.GLOBAL_SYNC for c in graph.consumers[red.name]}
    kernel = {(red.name, c): Conn.KERNEL for c in graph.consumers[red.name]}
    with Caches("walk").active():
        behind = validate._checked_tile(graph, seg, barrier, tile, dev, "g")
        apart = validate._checked_tile(graph, seg, kernel, tile, dev, "g")
    assert behind == _fresh(validate._check_tile, graph, seg, barrier, tile, dev, "g")
    assert apart == _fresh(validate._check_tile, graph, seg, kernel, tile, dev, "g")
    assert any("splits rows" in v.message for v in apart) and not any("splits rows" in v.message for v in behind)
