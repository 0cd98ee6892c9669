"""Edits (engine/schedule/edits.py): JSON round trip, deterministic replay, identical layers, and
the edit fuzzer (edit_fuzz.py): random edit sequences over five graphs, each edit applied (valid plan) or
refused naming a rule, edited plans matching onnxruntime on the CPU backend, and a floor on the applied share."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from engine.device import get_device
from engine.errors import PlanError
from engine.schedule.edits import apply_edit, apply_to_identical_layers, replay
from engine.schedule.plan import Conn, Edit, plan_from_json, plan_to_json
from engine.schedule.policies import make_plan
from engine.schedule.validate import validate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from edit_fuzz import Tally, fuzz_sequence, load_fuzz_model, sequence_st  # noqa: E402

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


def test_an_edit_keeps_the_kernels_it_does_not_touch():
    """welder's GLOBAL_SYNC merges keep each side's tiles while a group grows, so its multi-segment
    kernels hold tiles a fresh search of the whole group would not pick: an edit elsewhere used to search
    them again, re-tiling (and making the app recompile) kernels the user never touched. On rtx3090, where
    the welder policy keeps its walk's plan for bert_layer, with such kernels (on a100 the stitch plan
    models faster)."""
    from support import sample_path

    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    device = get_device("rtx3090")
    graph, plan = plan_model(load_graph(sample_path("bert_layer"), {}), "welder", device)
    assert "the walk's kept" in next(d for d in plan.decisions if d.startswith("welder: "))
    target = next(g for g in plan.groups if len(g.segments) == 1 and len(g.stages) > 1)
    inner = next(e for e in plan.edges if e.conn.fused and e.producer in target.stages and e.consumer in target.stages)
    edited = apply_edit(plan, graph, device, Edit.make("split", producer=inner.producer, consumer=inner.consumer))
    assert edited.kernels == plan.kernels + 1
    after = {g.stages: g for g in edited.groups}
    others = [g for g in plan.groups if g is not target]
    assert any(len(g.segments) > 1 for g in others)  # kept tiles are among them
    for g in others:
        kept = after[g.stages]
        assert (kept.segments, kept.candidates, kept.cost, kept.score) == (g.segments, g.candidates, g.cost, g.score)
    assert validate(edited, graph, device) == []
    # and the edited plan is what a replay of the edit gives
    assert plan_to_json(replay("welder", edited.edits, graph, device))["groups"] == plan_to_json(edited)["groups"]


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


# Applied share floor. Measured: random runs apply 61-78 % of edits (batches of 30 sequences: 61, 65, 67,
# 68, 73, 78 %; 600 sequences on a100 + v100: 64 % of 1846 edits; 300 with the optional set_tile arguments:
# 73 % of 845; 240 on rtx3090 + h100: 66 % of 713); the derandomized quick profile applies 57 of 76 (75 %). The refused rest are footprint /
# recompute / group_cycle / segment_sink / register_one_to_many violations or a set_tile on a stage that
# anchors no segment. 30 % is half the lowest measurement: room for sampling noise in the slow (random)
# profile, yet it fails if the generator drifts into mostly refused edits (edges or stages of the wrong
# graph, tiles that never fit).
APPLIED_FLOOR = 0.30


def _fuzz(a100, examples: int, cpu_runs: int, *, derandomize: bool) -> Tally:
    """Random edit sequences over GRAPHS: every edit is applied (the plan validates) or refused naming a
    rule; up to `cpu_runs` edited final plans run on the CPU backend and match onnxruntime."""
    tally = Tally()

    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(seq=sequence_st)
    def one(seq):
        seen = len(tally.unnamed), len(tally.failures)
        targets = ("cpu",) if sum(tally.runs.values()) < cpu_runs else ()
        plan = fuzz_sequence(seq, a100, tally, targets)
        assert (len(tally.unnamed), len(tally.failures)) == seen, (tally.unnamed[-1:], tally.failures[-1:])
        if plan.edits and not seq["batching"]:
            _, graph = load_fuzz_model(seq["graph"])
            again = replay(seq["base"], plan.edits, graph, get_device(plan.device), options={"batching": False})
            # Replay is deterministic: the same connections and kernels. An edge's reason may word a bounded
            # trial's refusal either way ("no tile models under X" or the rule every tile breaks), depending
            # on which search ran first (tiles.search_group), so only its verdict is compared.
            def verdicts(p):
                return [(e.producer, e.consumer, e.conn, e.score, e.source) for e in p.edges]
            assert verdicts(again) == verdicts(plan)
            assert again.groups == plan.groups

    one()
    return tally


def _check_tally(tally: Tally, min_edits: int, cpu_runs: int) -> None:
    assert tally.edits >= min_edits, tally
    assert tally.applied_share >= APPLIED_FLOOR, (tally.applied_share, dict(tally.refused))
    assert set(tally.kinds) == {"set_edge", "split", "merge", "set_tile"}, tally.kinds  # every kind applied
    assert len(tally.refused) >= 2, tally.refused  # the legality checks were exercised too
    assert tally.runs["cpu", "pass"] >= cpu_runs and not tally.failures, tally.failures


def test_random_edits_stay_valid_or_name_a_rule(a100):
    tally = _fuzz(a100, examples=40, cpu_runs=12, derandomize=True)
    _check_tally(tally, min_edits=60, cpu_runs=12)


@pytest.mark.slow
def test_edit_fuzz_many_sequences(a100):
    tally = _fuzz(a100, examples=1500, cpu_runs=400, derandomize=False)
    _check_tally(tally, min_edits=2500, cpu_runs=400)
