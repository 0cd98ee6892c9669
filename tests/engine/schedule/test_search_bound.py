"""The sched5 cuts of the tile search (benchmarks/NOTES.md sched5): a group its connections alone refuse
tries no candidate (`validate.refused_whatever_tiles`), and a merge trial's search is bounded by what the
walk needs it to beat (`search_group`'s `bound`). Each is checked against the search without it, on the
searches a real walk makes."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule import build, cost, tiles, validate
from engine.schedule.pipeline import plan_model
from engine.tilegraph.tilegraph import segment_sinks, segments_of

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


def _walk_searches(name: str, device: str, monkeypatch) -> list[tuple]:
    """Every search_group call the welder walk of a sample makes: (graph, stages, conns, mode, fixed, bound)."""
    graph, dev = load_graph(SAMPLES / f"{name}.onnx"), get_device(device)
    seen = []
    search = tiles.search_group

    def spy(graph, stages, conns, device, mode, fixed=None, k=tiles.TOP_K, bound=math.inf):
        if k == 1:
            seen.append((graph, tuple(stages), dict(conns), mode, dict(fixed or {}), bound))
        return search(graph, stages, conns, device, mode, fixed, k, bound)

    monkeypatch.setattr(build, "search_group", spy)
    with Caches("walk").active():
        plan_model(graph, "welder", dev)
    monkeypatch.undo()
    return seen


def _counted(monkeypatch) -> list[int]:
    """Kernel-IR builds (`cost._segment_use` calls) from here on, in a list's one element."""
    builds = [0]
    use = cost._segment_use

    def counted(*args, **kwargs):
        builds[0] += 1
        return use(*args, **kwargs)

    monkeypatch.setattr(cost, "_segment_use", counted)
    return builds


@pytest.mark.parametrize(("name", "device"), [("bert_layer", "a100")])
def test_group_refused_by_its_connections_is_scheduled_as_before_without_builds(name, device, monkeypatch):
    """Every group of the walk's trials that `refused_whatever_tiles` finds: check_group refuses it at
    random tiles of its pools too, and its schedule equals the one searched with the cut off, which
    builds more kernels (the cut is not vacuous)."""
    dev, rng = get_device(device), random.Random(7)
    found = {(id(g), s, tuple(sorted(c.items())), m): (g, s, c, m) for g, s, c, m, f, _ in
             _walk_searches(name, device, monkeypatch) if not f}
    hopeless = [(g, s, c, m) for g, s, c, m in found.values()
                if validate.refused_whatever_tiles(g, s, c, segments_of(g, s, c))]
    assert hopeless
    builds = _counted(monkeypatch)
    with_cut, cut_builds = [], 0
    for graph, stages, conns, mode in hopeless:
        segs = segments_of(graph, stages, conns)
        for _ in range(3):
            picked = [rng.choice(tiles.candidate_tiles(graph, seg, segment_sinks(graph, seg, conns)[-1], dev, mode) or [None]) for seg in segs]
            if None not in picked:
                assert validate.check_group(graph, stages, conns, picked, dev, segs=segs)
        before = builds[0]
        with Caches("cut").active():
            with_cut.append(tiles.search_group(graph, stages, conns, dev, mode, k=1))
        cut_builds += builds[0] - before
    monkeypatch.setattr(tiles, "refused_whatever_tiles", lambda *args: False)
    full_builds = 0
    for (graph, stages, conns, mode), cut in zip(hopeless, with_cut):
        before = builds[0]
        with Caches("full").active():
            assert tiles.search_group(graph, stages, conns, dev, mode, k=1) == cut
        full_builds += builds[0] - before
    assert cut_builds < full_builds


@pytest.mark.parametrize(("name", "device"), [("bert_layer", "a100"), ("nerf_mlp", "a100"),
                                              pytest.param("vit_block", "host", marks=pytest.mark.slow)])
def test_bounded_search_is_the_search_or_says_above(name, device, monkeypatch):
    """Every bounded search of the walk, and the same groups under random bounds around their modeled
    time: the schedule is the unbounded search's, or it has no tiles and `above` is the bound, and then
    the unbounded search's schedule is refused or models over the bound (exact cost). Some bounded
    search answered above with fewer builds than the unbounded one (the cut is not vacuous)."""
    dev, rng = get_device(device), random.Random(11)
    calls = [c for c in _walk_searches(name, device, monkeypatch) if c[5] < math.inf]
    assert calls
    builds = _counted(monkeypatch)
    saved = 0
    for graph, stages, conns, mode, fixed, bound in calls[:: max(1, len(calls) // 25)]:
        with Caches("full").active():
            before = builds[0]
            full = tiles.search_group(graph, stages, conns, dev, mode, fixed or None, k=1)
            full_builds = builds[0] - before
        figure = full.cost.modeled_us if full.cost else 1.0
        for b in (bound, figure * rng.uniform(0.5, 1.0), figure * rng.uniform(1.0, 1.5)):
            with Caches("bounded").active():
                before = builds[0]
                got = tiles.search_group(graph, stages, conns, dev, mode, fixed or None, k=1, bound=b)
                bounded_builds = builds[0] - before
            if got.above:
                assert got.above == b and got.tiles == () and got.cost is None
                assert full.violations or full.cost.modeled_us > b, (stages, b, full.cost.modeled_us)
                saved += bounded_builds < full_builds
            else:
                assert got == full, stages
    assert saved


@pytest.mark.parametrize(("name", "device", "policy"), [
    ("bert_layer", "a100", "welder"), ("vit_block", "a100", "welder"), ("mobilenetv2_block", "a100", "welder"),
    ("layernorm_residual", "host", "welder"),
    # 65 token rows in tiles of 64: the exact cost half the typical tile's (`tiles._fill`)
    ("zoo/vit", "host", "stitch")])
def test_walk_with_bounded_trials_makes_the_plan_of_unbounded_ones(name, device, policy, monkeypatch):
    """The plan with the walk's trials bounded has the connections, groups, tiles and modeled time of
    the plan made with every trial searched unbounded; only the reasons of levels the bounded search
    refused read otherwise."""
    graph, dev = load_graph(SAMPLES / f"{name}.onnx"), get_device(device)
    with Caches("bounded").active():
        bounded = plan_model(graph, policy, dev)[1]
    search = tiles.search_group
    monkeypatch.setattr(build, "search_group", lambda *args, bound=math.inf, **kwargs: search(*args, **kwargs))
    with Caches("unbounded").active():
        unbounded = plan_model(graph, policy, dev)[1]
    assert [(e.key, e.conn) for e in bounded.edges] == [(e.key, e.conn) for e in unbounded.edges]
    assert [(g.stages, g.segments, g.score) for g in bounded.groups] == \
        [(g.stages, g.segments, g.score) for g in unbounded.groups]
    assert bounded.modeled_us == unbounded.modeled_us and bounded.dram_bytes == unbounded.dram_bytes
    stopped = [(a.reason, b.reason) for a, b in zip(bounded.edges, unbounded.edges) if a.reason != b.reason]
    assert all("the tile search stopped there" in a for a, _ in stopped)
