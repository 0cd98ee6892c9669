"""engine/schedule/build.py `coarsen_plan` on a CPU device: the C target's coarser tiles replace the searched
ones only where their exact cost models at most COARSEN_SLACK times the searched tiles' (zoo mobilevit's
expand 1x1 + depthwise 3x3 group, widened from 1 to 16 channels per block, modeled 6.6x its searched tiles
and measured 334 us against 31 at its searched tiles: benchmarks/NOTES.md coarsenguard)."""

from __future__ import annotations

import math

import pytest
from support import sample_path

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule import build
from engine.schedule.pipeline import plan_model


@pytest.fixture(scope="module")
def graph():
    return load_graph(sample_path("mobilenetv2_block"))


def _plan(graph, monkeypatch, slack=None, coarsen=True):
    monkeypatch.setattr(build, "COARSEN_SLACK", build.COARSEN_SLACK if slack is None else slack)
    if not coarsen:
        monkeypatch.setattr(build, "coarsen_plan", lambda plan, *args, **kwargs: plan)
    with Caches("test").active():  # coarsenings are memoised: each variant starts afresh
        plan = plan_model(graph, "unfused", get_device("host"))[1]
    monkeypatch.undo()
    return {g.stages: g for g in plan.groups}


def test_a_coarsening_is_kept_only_where_the_model_allows_it(graph, monkeypatch):
    searched = _plan(graph, monkeypatch, coarsen=False)
    unguarded = _plan(graph, monkeypatch, slack=math.inf)
    coarsened = [s for s, g in unguarded.items() if g.segments != searched[s].segments]
    assert coarsened, "the sample's convs are coarsened on the host"
    # Slack 0: no coarsening models at or under nothing, so every group keeps its searched tiles.
    assert {s: g.segments for s, g in _plan(graph, monkeypatch, slack=0.0).items()} == \
        {s: g.segments for s, g in searched.items()}
    # The default keeps each coarsening its model allows and no other.
    guarded = _plan(graph, monkeypatch)
    for stages, group in guarded.items():
        before = searched[stages].cost.modeled_us
        wider = unguarded[stages]
        if wider.segments == searched[stages].segments:
            continue
        allowed = wider.cost.modeled_us <= before * build.COARSEN_SLACK
        assert group.segments == (wider.segments if allowed else searched[stages].segments), stages
        assert group.cost.modeled_us <= before * build.COARSEN_SLACK + 1e-9
