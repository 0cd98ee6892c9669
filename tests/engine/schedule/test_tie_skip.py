"""The tile search skips a candidate that could at most tie the k-th best's modeled time and whose score floor
is above that one's score, which breaks the tie (`tiles._cannot_enter`, benchmarks/NOTES.md tieskip). Checked
against the search that costs them: the same plans, edges, tiles, candidate lists and costs, fewer candidates
costed; and the score floor (`floor.score_floor`) is under every costed candidate's score."""

from __future__ import annotations

from pathlib import Path

import pytest
from sched_graphs import pool_model

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule import floor, tiles
from engine.schedule.cost import segment_use
from engine.schedule.pipeline import plan_model

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


def _graph(name: str, tmp_path: Path):
    if name == "pool":
        path = tmp_path / "pool.onnx"
        path.write_bytes(pool_model().SerializeToString())
        return load_graph(path)
    return load_graph(SAMPLES / f"{name}.onnx")


def _shape(plan) -> tuple:
    return ([(e.key, e.conn) for e in plan.edges],
            [(g.stages, g.segments, g.candidates, g.cost.modeled_us if g.cost else None) for g in plan.groups])


def _costing(monkeypatch) -> list:
    """Spy on the passes' estimates: (trial, its score floor from the pass's memo, the cost) per candidate."""
    seen: dict = {}
    out: list = []
    floor_us, estimate = tiles.floor_us, tiles.estimate_group

    def spy_floor(graph, stages, conns, trial, device, segs, local=None):
        value = floor_us(graph, stages, conns, trial, device, segs, local)
        seen[id(trial)] = (trial, floor.score_floor(trial, device, local))
        return value

    def spy_estimate(*args, **kwargs):
        cost = estimate(*args, **kwargs)
        got = seen.get(id(args[3]))
        if got is not None and got[0] is args[3] and not kwargs.get("exact"):
            out.append((args[3], got[1], cost))
        return cost

    monkeypatch.setattr(tiles, "floor_us", spy_floor)
    monkeypatch.setattr(tiles, "estimate_group", spy_estimate)
    return out


@pytest.mark.parametrize(("name", "device"), [("pool", "host"), ("pool", "a100"), ("conv_bn_relu", "host"),
                                              ("vit_block", "host"), ("layernorm_residual", "a100")])
def test_score_floor_is_under_every_costed_score(name, device, tmp_path, monkeypatch):
    graph, dev = _graph(name, tmp_path), get_device(device)
    costed = _costing(monkeypatch)
    with Caches("score").active():
        plan_model(graph, "welder", dev)
    assert costed
    for trial, least, cost in costed:
        score = (cost.traffic_bytes["dram"] + cost.traffic_bytes["l2"] + 1) * cost.waves
        assert least <= score, (trial, least, score)


def test_a_padded_pool_loads_no_more_than_its_count(tmp_path):
    """`work_floor` leaves padded loads out: the kernel IR loads none of a border tile's out-of-range taps,
    so a padded max pool's average block loads less than its typical (interior) tile (zoo resnet's stem
    pool: a floor of 40 B a block against the count's 38.5 before)."""
    graph, dev = _graph("pool", tmp_path), get_device("host")
    pool = next(s.name for s in graph.stages if s.op == "maxpool")
    for tile in tiles.candidate_tiles(graph, [pool], pool, dev, "tiles"):
        use = segment_use(graph, [pool], {}, tile, device=dev)
        glob, _, _, _ = floor.work_floor(graph, [pool], {}, use.regions)
        assert glob <= use.global_bytes * (1 + 1e-9), (tile, glob, use.global_bytes)


@pytest.mark.parametrize(("name", "device"), [("vit_block", "host"), ("bert_layer", "host"), ("pool", "host"),
                                              ("vit_block", "a100"), ("masked_softmax", "a100"),
                                              ("layernorm_residual", "a100")])
def test_skipping_ties_keeps_every_plan(name, device, tmp_path, monkeypatch):
    """The plan with the skip equals the plan of the search that costs every candidate its floor lets in
    (edges, tiles, candidate lists, costs), with fewer candidates costed on the host's samples."""
    graph, dev = _graph(name, tmp_path), get_device(device)
    costed = _costing(monkeypatch)
    with Caches("skip").active():
        skipping = plan_model(graph, "welder", dev)[1]
    fewer = len(costed)
    costed.clear()
    monkeypatch.setattr(tiles, "_cannot_enter", lambda *a: False)
    with Caches("all").active():
        every = plan_model(graph, "welder", dev)[1]
    assert _shape(skipping) == _shape(every)
    assert fewer <= len(costed)
    if device == "host" and name != "pool":
        assert fewer < len(costed), (fewer, len(costed))


@pytest.mark.parametrize(("name", "device"), [("layernorm_residual", "a100"), ("masked_softmax", "a100")])
def test_the_score_condition_is_needed(name, device, tmp_path, monkeypatch):
    """Not vacuous: skipping every candidate that could at most tie, whatever its score, changes these
    plans (a tie's score decides between tilings of one modeled time)."""
    graph, dev = _graph(name, tmp_path), get_device(device)
    with Caches("skip").active():
        skipping = plan_model(graph, "welder", dev)[1]

    def floor_only(scored, k, least, score):
        top = tiles._distinct(sorted(scored, key=tiles._rank))
        return len(top) >= k and tiles._models_at_least(least, top[k - 1][1])

    monkeypatch.setattr(tiles, "_cannot_enter", floor_only)
    with Caches("widened").active():
        widened = plan_model(graph, "welder", dev)[1]
    assert _shape(skipping) != _shape(widened)
