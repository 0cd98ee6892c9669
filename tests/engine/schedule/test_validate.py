"""validate (engine/schedule/validate.py): every illegal edit is refused with the rule it breaks."""

from __future__ import annotations

import dataclasses

import pytest

from engine.errors import PlanError
from engine.schedule.edits import apply_edit
from engine.schedule.plan import SCHEMA_VERSION, Conn, Edit
from engine.schedule.policies import make_plan
from engine.schedule.validate import RULES, validate


def _rule_of(err: PlanError) -> str:
    text = str(err)
    return next(name for name in RULES if f"({name})" in text)


@pytest.fixture
def unfused(attn_graph, a100):
    return make_plan(attn_graph, "unfused", a100)


def test_policies_give_legal_plans(attn_graph, a100):
    for policy in ("unfused", "elementwise", "stitch", "welder"):
        plan = make_plan(attn_graph, policy, a100)
        assert validate(plan, attn_graph, a100) == []


def test_register_from_reduction_read_one_to_many_is_rule_2(attn_graph, a100, unfused):
    # exp reads max[i] for every column: inlined at REGISTER, each element would redo the row's max,
    # whatever the thread mapping; the edit names the edge and the count.
    with pytest.raises(PlanError) as err:
        apply_edit(unfused, attn_graph, a100, Edit.make("set_edge", producer="sm::max", consumer="sm::exp",
                                                          conn="register"))
    assert _rule_of(err.value) == "register_one_to_many"
    assert "sm::max -> sm::exp" in str(err.value) and "recompute 24x > 1x" in str(err.value)
    # Through shared memory the block computes each row's max once: legal.
    plan = apply_edit(unfused, attn_graph, a100, Edit.make("set_edge", producer="sm::max", consumer="sm::exp",
                                                            conn="shared"))
    assert plan.group_of("sm::exp").cost.recompute_factor < 1.5


def test_recompute_over_the_bound_is_rule_9_and_the_bound_is_a_plan_option(tmp_path, a100):
    """An expensive per-row value (exp of a sqrt) inlined into a product that reads it from every
    column is recomputed per use: ~7x the segment's work done once, over the default bound of 2x, is
    rule 9 with the factor on the edge; with the plan option recompute_bound=10 it is legal, and
    through shared memory it is computed once per row."""
    import onnx
    from onnx import TensorProto, helper

    from engine.api import load_graph

    nodes = [helper.make_node("Sqrt", ["x"], ["s"], name="sqrt"), helper.make_node("Exp", ["s"], ["e"], name="exp"),
             helper.make_node("Mul", ["e", "z"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "bcast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1]),
                                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [64, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])])
    path = tmp_path / "bcast.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    g = load_graph(path)
    base = make_plan(g, "unfused", a100)
    with pytest.raises(PlanError) as err:
        apply_edit(base, g, a100, Edit.make("set_edge", producer="e", consumer="y", conn="register"))
    assert _rule_of(err.value) == "recompute" and "e -> y" in str(err.value)
    assert "recompute" in str(err.value) and "> 2x" in str(err.value)
    loose = make_plan(g, "unfused", a100, options={"recompute_bound": 10.0})
    plan = apply_edit(loose, g, a100, Edit.make("set_edge", producer="e", consumer="y", conn="register"))
    assert not validate(plan, g, a100)
    assert 2 < plan.group_of("y").cost.recompute_factor < 10
    shared = apply_edit(base, g, a100, Edit.make("set_edge", producer="e", consumer="y", conn="shared"))
    assert shared.group_of("y").cost.recompute_factor < 1.5 and not validate(shared, g, a100)


def test_fusing_around_an_outside_stage_is_rule_5(attn_graph, a100, unfused):
    with pytest.raises(PlanError) as err:
        apply_edit(unfused, attn_graph, a100, Edit.make("set_edge", producer="add", consumer="sm::exp", conn="register"))
    assert _rule_of(err.value) == "group_cycle"


def test_huge_tile_is_rule_1(attn_graph, a100, unfused):
    plan = apply_edit(unfused, attn_graph, a100, Edit.make("merge", producer="mm", consumer="add"))
    with pytest.raises(PlanError) as err:
        apply_edit(plan, attn_graph, a100, Edit.make("set_tile", stage="add", shape=[16, 24], threads=2048))
    assert _rule_of(err.value) == "footprint"


def test_global_sync_beyond_one_wave_is_rule_4(tmp_path, a100):
    import onnx
    from sched_graphs import attention_model

    from engine.frontend.importer import load_graph

    onnx.save(attention_model(m=8192, k=8, n=64), tmp_path / "big.onnx")
    graph = load_graph(tmp_path / "big.onnx")
    plan = make_plan(graph, "unfused", a100)
    plan = apply_edit(plan, graph, a100, Edit.make("set_edge", producer="sm", consumer="out", conn="global_sync"))
    with pytest.raises(PlanError) as err:  # 8192 rows one per block: far more than one resident wave
        apply_edit(plan, graph, a100, Edit.make("set_tile", stage="out", shape=[1, 64], threads=64))
    assert _rule_of(err.value) == "global_sync_wave"


def test_two_sinks_is_rule_7(attn_graph, a100, unfused):
    plan = apply_edit(unfused, attn_graph, a100, Edit.make("set_edge", producer="sm::exp", consumer="sm::sum",
                                                            conn="register"))
    # exp -> sm fused while sum -> sm stays a kernel edge: sum and sm both end the segment.
    with pytest.raises(PlanError) as err:
        apply_edit(plan, attn_graph, a100, Edit.make("set_edge", producer="sm::exp", consumer="sm", conn="register"))
    assert _rule_of(err.value) == "segment_sink"
    assert "2 sinks" in str(err.value)
    # Merging the edge instead fuses sum -> sm as well: legal again.
    merged = apply_edit(plan, attn_graph, a100, Edit.make("merge", producer="sm::exp", consumer="sm"))
    assert merged.edge("sm::sum", "sm").conn.fused
    assert validate(merged, attn_graph, a100) == []


def test_foreign_plan_and_schema_are_rule_6(attn_graph, a100, unfused, tmp_path):
    import onnx
    from sched_graphs import attention_model

    from engine.frontend.importer import load_graph

    onnx.save(attention_model(seed=1), tmp_path / "other.onnx")
    other = load_graph(tmp_path / "other.onnx")
    assert [v.rule for v in validate(unfused, other, a100)] == ["foreign_plan"]
    old = dataclasses.replace(unfused, schema=SCHEMA_VERSION + 1)
    assert [v.rule for v in validate(old, attn_graph, a100)] == ["foreign_plan"]


def test_missing_stage_is_rule_8(attn_graph, a100, unfused):
    broken = dataclasses.replace(unfused, groups=unfused.groups[1:])
    rules = {v.rule for v in validate(broken, attn_graph, a100)}
    assert rules == {"stage_coverage"}


def test_shared_region_too_big_is_rule_3(tmp_path, a100):
    import onnx
    from sched_graphs import attention_model

    from engine.frontend.importer import load_graph

    onnx.save(attention_model(m=4, k=8, n=65536), tmp_path / "wide.onnx")
    graph = load_graph(tmp_path / "wide.onnx")
    plan = make_plan(graph, "unfused", a100)
    # One reduced row needs the whole 65536-float row of exp (256 KiB) in shared memory.
    with pytest.raises(PlanError) as err:
        apply_edit(plan, graph, a100, Edit.make("set_edge", producer="sm::exp", consumer="sm::sum", conn="shared"))
    assert _rule_of(err.value) in ("footprint", "shared_locality")
    from engine.schedule.tiles import make_tile
    from engine.schedule.validate import check_group

    tile = make_tile(graph.stage("sm::sum"), (1, 1), 256)
    found = check_group(graph, ["sm::exp", "sm::sum"], {("sm::exp", "sm::sum"): Conn.SHARED}, [tile], a100)
    assert "shared_locality" in {v.rule for v in found}


def test_expressions_too_deep_to_count_are_refused_not_hung(attn_graph, a100, unfused, monkeypatch):
    """Reductions inlined into reductions (lstm steps chained at REGISTER on the host) nest past what
    can be counted — or run — in time: past the count's budget a segment is refused under rule 9 with
    the reason, and the walk goes on to another level. (Budgets here are scaled down to this graph.)"""
    import contextlib

    from engine.codegen import count
    from engine.memo import Caches

    session = contextlib.ExitStack()

    def budget(n: int) -> None:
        monkeypatch.setattr(count, "VISIT_BUDGET", n)
        session.close()
        session.enter_context(Caches().active())  # fresh tables: nothing counted under another budget is reused

    budget(3)
    with pytest.raises(PlanError) as err:
        apply_edit(unfused, attn_graph, a100, Edit.make("set_edge", producer="add", consumer="sm::max",
                                                          conn="register"))
    assert _rule_of(err.value) == "recompute" and "too deep to count" in str(err.value)
    budget(5)  # every stage alone fits, some fusions do not
    plan = make_plan(attn_graph, "welder", a100)
    assert validate(plan, attn_graph, a100) == []
    assert any("too deep to count" in e.reason for e in plan.edges)
    session.close()
