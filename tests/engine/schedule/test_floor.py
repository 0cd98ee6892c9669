"""The tile search's floor (engine/schedule/floor.py) is a lower bound: over random graphs and every
candidate tile of their plans' segments, the bytes and flops `work_floor` derives from regions never
exceed what the kernel IR's count gives for the same segment and tile, `floor_us` never exceeds the
modeled time, `score_floor` never exceeds the tie-break score, and a segment `serial_for_sure` says the C
target runs on one thread is costed so. A floor above either would prune the winner and change the plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_graphs import onnx_models
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_graphs import candidate_trials
from support import plan_random

from engine.codegen.count import CountBudgetError
from engine.device import get_device
from engine.errors import PlanError
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule import tiles
from engine.schedule.cost import estimate_group, segment_use
from engine.schedule.floor import floor_us, score_floor, serial_for_sure, surely_parallel, work_floor
from engine.schedule.pipeline import plan_model
from engine.tilegraph.tilegraph import segments_of

SLACK = 1e-6


def _check_plan_segments(graph, plan, device) -> int:
    conns = {e.key: e.conn for e in plan.edges}
    checked = 0
    for group, segs, seg, tile, trial in candidate_trials(graph, plan, device, limit=40):
        try:
            use = segment_use(graph, seg, conns, tile, device=device)
            cost = estimate_group(graph, group.stages, conns, trial, device, segs=segs)
        except (CountBudgetError, PlanError):
            continue  # refused by the search's checks: never costed
        glob, macs, other, maths = work_floor(graph, seg, conns, use.regions)
        assert glob <= use.global_bytes * (1 + SLACK) + SLACK, (seg, tile, glob, use.global_bytes)
        assert macs + other <= use.flops_fp32 * (1 + SLACK) + SLACK, (seg, tile, macs, other, use.flops_fp32)
        # Per-element flops (a contraction's among them where no phase computing it can be a tiled GEMM or
        # direct convolution: `generate.may_tile`) are never the kernel IR's tiled ones.
        per_element = use.flops_fp32 + use.flops_tc - use.flops_tiled
        assert other <= per_element * (1 + SLACK) + SLACK, (seg, tile, other, per_element)
        assert maths <= min(other, use.flops_math) * (1 + SLACK) + SLACK, (seg, tile, maths, use.flops_math)
        if device.kind == "cpu" and serial_for_sure(graph, seg, conns, tile, use.regions):
            # the floor charged it on one core; the model costs each segment as its own kernel would run
            assert segment_use(graph, seg, conns, tile, device=device).serial, (group.name, tile)
            assert cost.serial_segments >= 1, (group.name, tile)
        if device.kind == "cpu" and surely_parallel(graph, tile, use.regions):
            assert not segment_use(graph, seg, conns, tile, device=device).serial, (group.name, tile)
        local: dict = {}
        floor = floor_us(graph, group.stages, conns, trial, device, segs, local)
        assert floor <= cost.modeled_us + tiles._FLOOR_SLACK, (group.name, tile, floor, cost.modeled_us)
        score = (cost.traffic_bytes["dram"] + cost.traffic_bytes["l2"] + 1) * cost.waves
        assert score_floor(trial, device, local) <= score, (group.name, tile, score_floor(trial, device, local), score)
        checked += 1
    return checked


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(onnx_models(), st.sampled_from(["a100", "v100", "host"]), st.sampled_from(["welder", "stitch", "unfused"]))
def test_floor_never_above_the_count_on_random_graphs(case, device_name, policy):
    model, _, _ = case
    device = get_device(device_name)
    with Caches("floor").active():
        graph, plan = plan_random(model, policy, device)
        assert _check_plan_segments(graph, plan, device) > 0


def test_floor_is_tight_on_a_gemm_segment():
    """Not vacuous: on bert_layer's welder plan (a100) some candidate's floor is within 2x of its modeled
    time — a floor of zero would pass the bound tests and prune nothing."""
    device = get_device("a100")
    root = Path(__file__).resolve().parents[3] / "samples"
    graph, plan = plan_model(load_graph(root / "bert_layer.onnx"), "welder", device)
    conns = {e.key: e.conn for e in plan.edges}
    ratios = []
    for group in plan.groups:
        segs = segments_of(graph, group.stages, conns)
        modeled = estimate_group(graph, group.stages, conns, group.segments, device, segs=segs).modeled_us
        ratios.append(floor_us(graph, group.stages, conns, group.segments, device, segs) / modeled)
    assert max(ratios) <= 1.0 + 1e-5  # modeled_us is rounded to 1e-4 us
    assert sum(r > 0.5 for r in ratios) >= len(ratios) // 2, ratios


def test_floor_charges_math_ops_at_the_math_rate():
    """On the host (two per-element rates) a lone tanh, exp or div kernel's floor is its modeled time: the
    floor counts the math ops the kernel IR counts and charges them at the math rate, as the model does (at
    the faster plain rate it was a fifth of it, and every tied candidate of such a segment was costed)."""
    device = get_device("host")
    assert device.plain_flops > device.elementwise_flops  # the host probe's two rates
    root = Path(__file__).resolve().parents[3] / "samples"
    checked = 0
    for name in ("gelu_chain", "masked_softmax"):
        graph, plan = plan_model(load_graph(root / f"{name}.onnx"), "unfused", device)
        conns = {e.key: e.conn for e in plan.edges}
        for group in plan.groups:
            segs = segments_of(graph, group.stages, conns)
            use = segment_use(graph, segs[0], conns, group.segments[0], device=device)
            if not use.flops_math:
                continue
            assert work_floor(graph, segs[0], conns, use.regions)[3] == use.flops_math, group.name
            modeled = estimate_group(graph, group.stages, conns, group.segments, device, segs=segs).modeled_us
            assert floor_us(graph, group.stages, conns, group.segments, device, segs) == pytest.approx(modeled, rel=1e-5)
            checked += 1
    assert checked >= 2


def _lone_segments(graph, plan, device):
    """(group, segs, seg, tile, trial, use, cost) for each candidate of a one-segment group of `plan` the model
    costs (those the search's checks refuse are left out)."""
    conns = {e.key: e.conn for e in plan.edges}
    for group, segs, seg, tile, trial in candidate_trials(graph, plan, device):
        if len(segs) != 1:
            continue
        try:
            use = segment_use(graph, seg, conns, tile, device=device)
            cost = estimate_group(graph, group.stages, conns, trial, device, segs=segs)
        except (CountBudgetError, PlanError):
            continue
        yield group, segs, seg, tile, trial, use, cost


@pytest.mark.parametrize("policy", ["unfused", "welder"])
@pytest.mark.parametrize("name", ["layernorm_residual", "vit_block", "gelu_chain", "masked_softmax"])
def test_serial_claims_hold_and_raise_the_floor(name, policy):
    """On a CPU of several threads the floor charges a lone segment whose element-steps are under
    ctarget.SERIAL_WORK for sure on one core (`serial_for_sure`): every candidate so claimed is costed as
    serial, and some are claimed with a floor it raised (not vacuous)."""
    device = get_device("host")
    root = Path(__file__).resolve().parents[3] / "samples"
    graph, plan = plan_model(load_graph(root / f"{name}.onnx"), policy, device)
    conns = {e.key: e.conn for e in plan.edges}
    claimed = raised = 0
    for group, segs, seg, tile, trial, use, cost in _lone_segments(graph, plan, device):
        if serial_for_sure(graph, seg, conns, tile, use.regions):
            claimed += 1
            assert cost.serial_segments == 1, (group.name, tile)
            floor = floor_us(graph, group.stages, conns, trial, device, segs)
            assert floor <= cost.modeled_us + tiles._FLOOR_SLACK
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr("engine.schedule.floor.serial_for_sure", lambda *a: False)
                raised += floor > floor_us(graph, group.stages, conns, trial, device, segs) + 1e-9
    if policy == "unfused":  # lone stages: some run serially on the host
        assert claimed and raised, (claimed, raised)


def test_serial_claims_reach_gemm_segments():
    """A segment with a contraction is claimed too where its GEMM phase's elements times its k stay under
    ctarget.SERIAL_WORK (no direct convolution can form, no weight-streaming GEMV can split statically):
    every such claim is costed as serial, and some are made (zoo-like attention's small batched matmuls)."""
    from engine.schedule.floor import _gemm_like

    device = get_device("host")
    root = Path(__file__).resolve().parents[3] / "samples"
    claimed = 0
    for name in ("vit_block", "bert_layer", "masked_softmax"):
        graph, plan = plan_model(load_graph(root / f"{name}.onnx"), "unfused", device)
        conns = {e.key: e.conn for e in plan.edges}
        for group, _, seg, tile, _, use, cost in _lone_segments(graph, plan, device):
            if any(_gemm_like(graph.stage(s)) for s in seg) and serial_for_sure(graph, seg, conns, tile, use.regions):
                claimed += 1
                assert cost.serial_segments == 1, (name, group.name, tile)
    assert claimed, "no contraction segment claimed serial"
