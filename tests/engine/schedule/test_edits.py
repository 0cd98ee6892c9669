"""Edits (engine/schedule/edits.py): JSON round trip, deterministic replay, identical layers, and
random legal/illegal edit sequences that always end in a valid plan or a PlanError naming a rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import PlanError
from engine.schedule.edits import apply_edit, apply_to_identical_layers, replay
from engine.schedule.plan import Conn, Edit, plan_from_json, plan_to_json
from engine.schedule.policies import make_plan
from engine.schedule.validate import RULES, validate

EDITS = (
    Edit.make("merge", producer="mm", consumer="add"),
    Edit.make("split", producer="sm", consumer="out"),
    Edit.make("set_tile", stage="add", shape=[8, 24], threads=64),
)


def _strip(d: dict) -> dict:
    d = dict(d)
    d.pop("schedule_seconds")
    return d


def test_json_round_trip(attn_graph, a100):
    plan = replay("unfused", EDITS, attn_graph, a100)
    text = json.dumps(plan_to_json(plan), sort_keys=True)
    again = plan_from_json(json.loads(text), attn_graph)
    assert again == plan
    assert again.edits == EDITS and again.policy == "user" and again.base_policy == "unfused"


def test_replay_is_deterministic(attn_graph, a100):
    a = plan_to_json(replay("unfused", EDITS, attn_graph, a100))
    b = plan_to_json(replay("unfused", EDITS, attn_graph, a100))
    assert _strip(a) == _strip(b)
    c = plan_to_json(replay("stitch", EDITS[1:2], attn_graph, a100))
    assert _strip(c) == _strip(plan_to_json(replay("stitch", EDITS[1:2], attn_graph, a100)))
    assert a["groups"] and a["edits"][0]["kind"] == "merge"


def test_edit_results(attn_graph, a100):
    plan = replay("unfused", EDITS[:1], attn_graph, a100)
    assert plan.edge("mm", "add").conn == Conn.REGISTER  # GEMM epilogue: the closest legal level
    assert plan.edge("mm", "add").source == "user"
    assert plan.kernels == make_plan(attn_graph, "unfused", a100).kernels - 1
    tiled = apply_edit(plan, attn_graph, a100, EDITS[2])
    assert tiled.group_of("add").segments[0].shape == (8, 24)
    assert tiled.group_of("add").segments[0].blocks == 2


def test_bad_edits_name_the_problem(attn_graph, a100):
    plan = make_plan(attn_graph, "unfused", a100)
    with pytest.raises(PlanError, match="not an edge"):
        apply_edit(plan, attn_graph, a100, Edit.make("split", producer="mm", consumer="out"))
    with pytest.raises(PlanError, match="unknown connection"):
        apply_edit(plan, attn_graph, a100, Edit.make("set_edge", producer="mm", consumer="add", conn="l3"))
    with pytest.raises(PlanError, match="anchors no segment"):
        merged = apply_edit(plan, attn_graph, a100, EDITS[0])
        apply_edit(merged, attn_graph, a100, Edit.make("set_tile", stage="mm", shape=[8, 8], threads=64))
    with pytest.raises(PlanError, match="unknown edit kind"):
        apply_edit(plan, attn_graph, a100, Edit.make("fuse_all"))


def test_identical_layers(tmp_path, a100):
    from engine.frontend.importer import load_graph

    graph = load_graph("samples/bert12.onnx")
    plan = make_plan(graph, "unfused", a100)
    first = next((p, c) for p, c in graph.edges if graph.stage(p).op == "matmul" and graph.stage(c).op == "add")
    out = apply_to_identical_layers(plan, graph, Edit.make("merge", producer=first[0], consumer=first[1]))
    changed = [e for e in out.edges if e.source == "user"]
    assert len(changed) >= 12  # the same projection epilogue in every one of the 12 layers
    assert len({graph.stage(e.consumer).shape for e in changed}) == 1
    assert validate(out, graph, a100) == []


edit_st = st.one_of(
    st.builds(lambda k, i, lvl: (k, i, lvl), st.sampled_from(["set_edge", "split", "merge"]),
              st.integers(0, 7), st.sampled_from([c.value for c in Conn])),
    st.builds(lambda i, r, c, t: ("set_tile", i, (r, c, t)), st.integers(0, 6), st.sampled_from([1, 2, 4, 16]),
              st.sampled_from([1, 8, 24]), st.sampled_from([32, 64, 256, 2048])),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(edit_st, min_size=1, max_size=4), base=st.sampled_from(["unfused", "welder"]))
def test_random_edits_stay_valid_or_name_a_rule(attn_graph, a100, steps, base):
    plan = make_plan(attn_graph, base, a100)
    stages = [s.name for s in attn_graph.stages]
    for kind, i, arg in steps:
        if kind == "set_tile":
            r, c, t = arg
            stage = stages[i]
            shape = [r, c] if len(attn_graph.stage(stage).shape) == 2 else [r]
            edit = Edit.make("set_tile", stage=stage, shape=shape, threads=t)
        else:
            p, c = attn_graph.edges[i]
            edit = Edit.make(kind, producer=p, consumer=c, **({"conn": arg} if kind == "set_edge" else {}))
        try:
            plan = apply_edit(plan, attn_graph, a100, edit)
        except PlanError as err:
            text = str(err)
            assert any(f"({rule})" in text for rule in RULES) or "anchors no segment" in text or \
                "illegal at every level" in text, text
            continue
        assert validate(plan, attn_graph, a100) == []
        assert plan.edits[-1] == edit
    again = replay(base, plan.edits, attn_graph, a100)
    assert _strip(plan_to_json(again)) == _strip(plan_to_json(plan)) or not plan.edits
