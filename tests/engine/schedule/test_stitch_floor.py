"""`welder.stitch_floor`: a floor under the stitch plan's modeled time, from the contractions' own tile searches
(on a CPU at the tiles the plan's coarsening leaves them) and the launches and stores of the stages between them;
where it shows the stitch plan cannot be WALK_MARGIN faster than the walk's, the welder policy does not make it
(benchmarks/NOTES.md stitchfloor, hoststitchfloor)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fuzz_graphs import onnx_models
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import plan_random

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule.pipeline import plan_model
from engine.schedule.policies import welder
from engine.schedule.policies.stitch import plan_stitch

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


@pytest.mark.parametrize(("name", "device"), [("bert_layer", "a100"), ("conv_bn_relu", "a100"), ("nerf_mlp", "h100"),
                                              ("mobilenetv2_block", "v100"), ("vit_block", "h100"),
                                              ("masked_softmax", "a100"), ("bert_layer", "host"), ("nerf_mlp", "host"),
                                              ("conv_bn_relu", "host"), ("layernorm_residual", "host")])
def test_floor_is_under_the_stitch_plan(name, device):
    """The floor never passes the stitch plan's modeled time (its L2 residency included); its contraction part
    is not 0 where the model has contractions, its part between them not 0 where it has other stages."""
    dev = get_device(device)
    with Caches("floor").active():
        planned, _ = plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", dev)
        floor = welder.stitch_floor(planned, dev)
        between = welder._between_floor(planned, dev)
        stitch = plan_stitch(planned, dev, {}, time.perf_counter())
    assert floor <= stitch.modeled_us + 1e-6
    has_contraction = any(s.kind.value == "contraction" for s in planned.stages)
    assert (floor - between > 1e-9) == has_contraction, (floor, between, has_contraction)
    assert between > 0


@pytest.mark.parametrize("name", ["bert_layer", "conv_bn_relu", "vit_block"])
def test_contraction_part_on_a_cpu_is_the_plans(name):
    """On a CPU the contractions' part of the floor is what the stitch plan's contraction kernels model (the
    search's tiles as its coarsening leaves them; no residency on a CPU), not only a floor under it."""
    dev = get_device("host")
    with Caches("floor").active():
        planned, _ = plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", dev)
        part = welder.stitch_floor(planned, dev) - welder._between_floor(planned, dev)
        stitch = plan_stitch(planned, dev, {}, time.perf_counter())
    kinds = {s.name: s.kind.value for s in planned.stages}
    kernels = sum(g.cost.modeled_us for g in stitch.groups if any(kinds[s] == "contraction" for s in g.stages))
    assert part == pytest.approx(kernels, rel=1e-9, abs=1e-6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(onnx_models(), st.sampled_from(["host", "a100", "v100"]))
def test_floor_is_under_the_stitch_plan_on_random_graphs(case, device_name):
    model, _, _ = case
    dev = get_device(device_name)
    with Caches("floor-random").active():
        planned, _ = plan_random(model, "welder", dev)
        stitch = plan_stitch(planned, dev, {}, time.perf_counter())
        assert welder.stitch_floor(planned, dev) <= stitch.modeled_us + 1e-6


@pytest.mark.parametrize(("name", "device"), [("conv_bn_relu", "a100"), ("nerf_mlp", "a100"), ("bert_layer", "host"),
                                              ("nerf_mlp", "host")])
def test_welder_plan_is_the_same_without_the_stitch_plan(name, device, monkeypatch):
    """Where the floor rules the stitch plan out, the welder plan is the one made when the stitch plan is
    made and refused; only the welder decision reads otherwise (after the batching log, where batched)."""
    graph, dev = load_graph(SAMPLES / f"{name}.onnx"), get_device(device)
    with Caches("skipped").active():
        skipped = plan_model(graph, "welder", dev)[1]
    mine = [d for d in skipped.decisions if d.startswith("welder: the walk's plan")]
    assert len(mine) == 1 and "not made" in mine[0]
    monkeypatch.setattr(welder, "stitch_floor", lambda graph, device: 0.0)
    with Caches("made").active():
        made = plan_model(graph, "welder", dev)[1]
    theirs = [d for d in made.decisions if d.startswith("welder: the walk's plan")]
    assert len(theirs) == 1 and "the walk's kept" in theirs[0] and "not made" not in theirs[0]
    assert [(e.key, e.conn, e.reason) for e in skipped.edges] == [(e.key, e.conn, e.reason) for e in made.edges]
    assert [(g.stages, g.segments, g.cost) for g in skipped.groups] == [(g.stages, g.segments, g.cost) for g in made.groups]
    assert [d for d in skipped.decisions if d not in mine] == [d for d in made.decisions if d not in theirs]
