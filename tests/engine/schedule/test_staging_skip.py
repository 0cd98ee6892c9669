"""The walk skips a SHARED trial after a kept REGISTER merge that evaluates every element once and runs no
segment serially, into a per-element consumer (`build.staging_saves_nothing`, benchmarks/NOTES.md sharedskip). Checked
against the walk that makes those trials: none of them would have been kept, and the plans are the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.ir.graph import StageKind
from engine.memo import Caches
from engine.schedule import build
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import Conn

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
# A CPU with fixed figures (a Zen 4's 1-thread probe), not this machine's: whether the rule fires depends on
# the figures (on a Zen 3 host bert_layer plans as two kernels and no trial is skipped), and this test
# checks the rule where it does fire. The live host is planned by the rest of the suite.
CPU = str(Path(__file__).resolve().parents[2] / "data" / "devices" / "host_epyc_1t.json")


def _shape(plan) -> tuple:
    return ([(e.key, e.conn) for e in plan.edges], [(g.stages, g.segments) for g in plan.groups], plan.modeled_us)


@pytest.mark.parametrize(("name", "device"), [("bert_layer", CPU), ("layernorm_residual", CPU),
                                              ("vit_block", "a100"), ("masked_softmax", "a100"),
                                              # relu -> maxpool models faster at SHARED: a reduction consumer is
                                              # left out of the rule, which this sample checks
                                              ("conv_bn_relu", "a100"),
                                              pytest.param("zoo/gpt2", CPU, marks=pytest.mark.slow)],
                         ids=lambda v: "cpu_file" if v == CPU else str(v))
def test_skipped_shared_trials_would_not_have_been_kept(name, device, monkeypatch):
    """With the rule's verdict recorded and the trials made anyway, every SHARED trial it would skip is
    refused or models no faster than the REGISTER merge it follows (so the walk would not have kept it),
    the plan equals the one the rule makes, and the rule skips some trials (it is not vacuous)."""
    graph, dev = load_graph(SAMPLES / f"{name}.onnx"), get_device(device)
    with Caches("skip").active():
        skipping = plan_model(graph, "welder", dev)[1]
    assert any(build.STAGING_SAVES_NOTHING in e.reason for e in skipping.edges)

    rule, try_level = build.staging_saves_nothing, build._try_level
    flagged: dict = {}
    outcomes: list = []

    def spy_rule(graph, edge, kept, trial):
        if rule(graph, edge, kept, trial):
            flagged[edge] = kept.score
        return False

    def spy_level(graph, conns, edge, level, *args, **kwargs):
        decision, trial = try_level(graph, conns, edge, level, *args, **kwargs)
        if level == Conn.SHARED and edge in flagged:
            outcomes.append((edge, decision, flagged[edge]))
        return decision, trial

    monkeypatch.setattr(build, "staging_saves_nothing", spy_rule)
    monkeypatch.setattr(build, "_try_level", spy_level)
    with Caches("trying").active():
        trying = plan_model(graph, "welder", dev)[1]
    assert outcomes
    for edge, decision, kept in outcomes:
        assert not decision.ok or decision.score >= kept - 1e-9, (edge, decision.reason, kept)
    assert _shape(skipping) == _shape(trying)


def test_rule_needs_a_register_merge_that_recomputes_nothing_into_an_elementwise_consumer():
    """The rule reads the kept decision's `once`, its level on the edge and the consumer's kind."""
    graph = load_graph(SAMPLES / "bert_layer.onnx")
    kinds = {s.name: s.kind for s in graph.stages}
    ew = next(e for e in graph.edges if kinds[e[1]] == StageKind.ELEMENTWISE)
    mm = next(e for e in graph.edges if kinds[e[1]] == StageKind.CONTRACTION)
    once = build.Decision(True, "register", 1.0, (), True)
    again = build.Decision(True, "register", 1.0, (), False)
    assert build.staging_saves_nothing(graph, ew, once, {ew: Conn.REGISTER})
    assert not build.staging_saves_nothing(graph, ew, again, {ew: Conn.REGISTER})
    assert not build.staging_saves_nothing(graph, ew, once, {ew: Conn.GLOBAL_SYNC})
    assert not build.staging_saves_nothing(graph, mm, once, {mm: Conn.REGISTER})


@pytest.mark.parametrize(("name", "device"), [("vit_block", "host"), ("vit_block", "a100"), ("masked_softmax", "a100")])
def test_extra_evaluations_agree_with_the_recompute_factor(name, device):
    """GroupCost.extra_evaluations is recorded on every kernel, never negative, and over 0 on every kernel
    without a contraction (whose padded micro-tiles also raise the flops) that does more flops than its
    stages once (recompute factor over 1): masked_softmax's a100 kernel recomputes its mask 1.4x."""
    graph, dev = load_graph(SAMPLES / f"{name}.onnx"), get_device(device)
    with Caches("extra").active():
        plan = plan_model(graph, "welder", dev)[1]
    assert all(g.cost.extra_evaluations is not None and g.cost.extra_evaluations >= 0 for g in plan.groups)
    recomputing = [g for g in plan.groups if g.cost.recompute_factor > 1.01
                   and not any(graph.stage(s).kind == StageKind.CONTRACTION for s in g.stages)]
    assert all(g.cost.extra_evaluations > 0 for g in recomputing)
    assert bool(recomputing) == (name == "masked_softmax")
    if name == "vit_block":  # fused kernels that evaluate once, beside (on a100) some that do not
        assert any(g.cost.extra_evaluations == 0 for g in plan.groups)
        assert any(g.cost.extra_evaluations > 0 for g in plan.groups) == (device == "a100")
