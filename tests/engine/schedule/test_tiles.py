"""Tile search (engine/schedule/tiles.py): the shortcuts that make it fast — candidates skipped by a
floor or refused before their kernel is built, trials that keep only the winner, a segment built once
per tile shape — never change a plan.
The reference is the exhaustive search: no floor, every caller keeping the top k, every segment built
afresh, each run on tables of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sched_graphs import candidate_trials

from engine.codegen import generate
from engine.codegen.count import CountBudgetError
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule import build, tiles
from engine.schedule.cost import estimate_group
from engine.schedule.floor import floor_us
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import plan_to_json
from engine.schedule.policies import elementwise

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
# zoo lstm: its concatenation of the steps' outputs models less exactly than its typical tile's floor; a bounded
# search cut by that floor refused a SHARED merge the exhaustive search keeps (`tiles.border_lighter`)
MODELS = ["layernorm_residual", "masked_softmax", "conv_bn_relu", "mobilenetv2_block", "lstm", "zoo/decoder_kv",
          "zoo/lstm"]


def _plan_json(graph, policy: str, device: str) -> dict:
    with Caches("test").active():
        _, plan = plan_model(graph, policy, device)
    data = plan_to_json(plan)
    data.pop("schedule_seconds")
    return data


def _exhaustive(monkeypatch) -> None:
    """The search as it was before the shortcuts: every candidate costed, every caller keeping TOP_K."""
    search = tiles.search_group

    def keep_all(*args, **kwargs):
        kwargs["k"] = tiles.TOP_K
        return search(*args, **kwargs)

    monkeypatch.setattr(tiles, "floor_us", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(tiles, "score_floor", lambda *args, **kwargs: 0.0)
    monkeypatch.setattr(tiles, "_cannot_enter", lambda *args, **kwargs: False)
    monkeypatch.setattr(tiles, "refused_early", lambda *args, **kwargs: False)
    monkeypatch.setattr(build, "search_group", keep_all)
    monkeypatch.setattr(elementwise, "search_group", keep_all)
    monkeypatch.setattr(generate, "_sampled_segment", generate._build_segment)


@pytest.mark.parametrize("device", ["a100", "host"])
@pytest.mark.parametrize("name", MODELS)
def test_fast_search_plans_as_the_exhaustive_one(name, device, monkeypatch):
    graph = load_graph(SAMPLES / f"{name}.onnx")
    policies = ("elementwise", "stitch", "welder") if not name.startswith("zoo/") else ("welder",)
    fast = {p: _plan_json(graph, p, device) for p in policies}
    _exhaustive(monkeypatch)
    for policy in policies:
        _assert_same_plan(fast[policy], _plan_json(graph, policy, device), f"{name} {policy} {device}")


STOPPED = "(the tile search stopped there)"


def _assert_same_plan(fast: dict, exhaustive: dict, what: str) -> None:
    """The plans are equal but for the wording of merges the walk's bounded trials refused without
    their figure (`build.can_connect`'s `beat`): such an edge's reason and its log line say so."""
    def texts(data: dict) -> list[str]:
        return [e["reason"] for e in data["edges"]] + list(data["decisions"])

    def rest(data: dict) -> dict:
        return {**data, "edges": [{**e, "reason": ""} for e in data["edges"]], "decisions": len(data["decisions"])}

    assert rest(fast) == rest(exhaustive), what
    for a, b in zip(texts(fast), texts(exhaustive)):
        assert a == b or STOPPED in a, (what, a, b)


@pytest.mark.parametrize("device", ["a100", "v100", "host"])
@pytest.mark.parametrize("name", ["bert_layer", "conv_bn_relu", "masked_softmax", "lstm"])
def test_floor_is_below_every_candidates_modeled_time(name, device):
    """Every candidate tile of every segment of the welder plan's kernels, with the other segments at
    their chosen tiles: the floor (regions only) never exceeds the modeled time (kernel IR built)."""
    dev = get_device(device)
    graph, plan = plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", dev)
    conns = {e.key: e.conn for e in plan.edges}
    checked = 0
    for group, segs, _, tile, trial in candidate_trials(graph, plan, dev):
        try:
            modeled = estimate_group(graph, group.stages, conns, trial, dev, segs=segs).modeled_us
        except CountBudgetError:  # a candidate the search refuses: too deep to count
            continue
        floor = floor_us(graph, group.stages, conns, trial, dev, segs)
        assert floor <= modeled + tiles._FLOOR_SLACK, (group.name, tile, floor, modeled)
        checked += 1
    # Not vacuous. How many candidates there are depends on the plan, and on "host" the plan on this
    # machine's probe figures (conv_bn_relu: 18 with one probe, over 20 with others).
    assert checked > 10, checked


def test_winner_is_the_same_for_any_k():
    dev = get_device("a100")
    graph, plan = plan_model(load_graph(SAMPLES / "bert_layer.onnx"), "welder", dev)
    conns = {e.key: e.conn for e in plan.edges}
    for group in plan.groups:
        with Caches("k1").active():
            one = tiles.search_group(graph, group.stages, conns, dev, "welder", k=1)
        with Caches("k6").active():
            six = tiles.search_group(graph, group.stages, conns, dev, "welder")
        assert (one.tiles, one.cost, one.violations) == (six.tiles, six.cost, six.violations)
        assert len(one.candidates) <= 1 and one.candidates == six.candidates[:1]
        with Caches("k1-then-6").active():  # a search keeping fewer candidates does not answer one wanting more
            tiles.search_group(graph, group.stages, conns, dev, "welder", k=1)
            assert tiles.search_group(graph, group.stages, conns, dev, "welder").candidates == six.candidates


def test_catalog_models_exist():
    names = {e["name"] for e in json.loads((SAMPLES / "catalog.json").read_text())}
    names |= {f"zoo/{e['name']}" for e in json.loads((SAMPLES / "zoo" / "catalog.json").read_text())}
    assert set(MODELS) <= names
