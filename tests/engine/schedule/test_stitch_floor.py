"""`welder.stitch_floor`: a floor under the stitch plan's modeled time on a GPU, from the contractions' own
tile searches; where it shows the stitch plan cannot be WALK_MARGIN faster than the walk's, the welder policy
does not make it (benchmarks/NOTES.md stitchfloor)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule.pipeline import plan_model
from engine.schedule.policies import welder
from engine.schedule.policies.stitch import plan_stitch

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


@pytest.mark.parametrize(("name", "device"), [("bert_layer", "a100"), ("conv_bn_relu", "a100"), ("nerf_mlp", "h100"),
                                              ("mobilenetv2_block", "v100"), ("vit_block", "h100"),
                                              ("masked_softmax", "a100")])
def test_floor_is_under_the_stitch_plan(name, device):
    """The floor never passes the stitch plan's modeled time (its L2 residency included), and is not 0 where
    the model has contractions."""
    dev = get_device(device)
    with Caches("floor").active():
        planned, _ = plan_model(load_graph(SAMPLES / f"{name}.onnx"), "welder", dev)
        floor = welder.stitch_floor(planned, dev)
        stitch = plan_stitch(planned, dev, {}, time.perf_counter())
    assert floor <= stitch.modeled_us + 1e-6
    has_contraction = any(s.kind.value == "contraction" for s in planned.stages)
    assert (floor > 0) == has_contraction, (floor, has_contraction)


def test_no_floor_on_a_cpu():
    """The C target's coarsening may retile a contraction outside its search's pool: no floor is claimed."""
    dev = get_device("host")
    with Caches("floor").active():
        planned, _ = plan_model(load_graph(SAMPLES / "conv_bn_relu.onnx"), "welder", dev)
        assert welder.stitch_floor(planned, dev) == 0.0


@pytest.mark.parametrize(("name", "device"), [("conv_bn_relu", "a100"), ("nerf_mlp", "a100")])
def test_welder_plan_is_the_same_without_the_stitch_plan(name, device, monkeypatch):
    """Where the floor rules the stitch plan out, the welder plan is the one made when the stitch plan is
    made and refused; only the first decision reads otherwise."""
    graph, dev = load_graph(SAMPLES / f"{name}.onnx"), get_device(device)
    with Caches("skipped").active():
        skipped = plan_model(graph, "welder", dev)[1]
    assert "not made" in skipped.decisions[0]
    monkeypatch.setattr(welder, "stitch_floor", lambda graph, device: 0.0)
    with Caches("made").active():
        made = plan_model(graph, "welder", dev)[1]
    assert "the walk's kept" in made.decisions[0] and "not made" not in made.decisions[0]
    assert [(e.key, e.conn, e.reason) for e in skipped.edges] == [(e.key, e.conn, e.reason) for e in made.edges]
    assert [(g.stages, g.segments, g.cost) for g in skipped.groups] == [(g.stages, g.segments, g.cost) for g in made.groups]
    assert skipped.decisions[1:] == made.decisions[1:]
