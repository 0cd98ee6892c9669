"""engine/schedule/residency.py: which inputs each kernel finds whole in L2, and the plan costed with them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.schedule.cost import estimate_group, nbytes
from engine.schedule.pipeline import plan_model
from engine.schedule.policies import make_plan
from engine.schedule.residency import kernel_touches, warm_inputs, with_l2_residency

ROOT = Path(__file__).resolve().parents[3] / "samples"
A100 = get_device("a100")


def _plan(name: str, policy: str, device=A100):
    graph = load_graph(ROOT / f"{name}.onnx")
    return graph, make_plan(graph, policy, device)


@pytest.mark.parametrize(("name", "policy"), [("bert_layer", "unfused"), ("bert_layer", "welder"),
                                              ("lstm", "stitch"), ("nerf_mlp", "elementwise")])
def test_a_warm_input_was_left_whole_by_an_earlier_kernel(name, policy):
    """Cold start: no kernel finds a graph input or weight warm at its first read, and every warm tensor was
    written by an earlier kernel or read whole by one; the plan's costs are the ones its warm sets give."""
    graph, plan = _plan(name, policy)
    conns = {e.key: e.conn for e in plan.edges}
    touched: dict[str, bool] = {}  # tensor -> left whole by some earlier kernel
    warm_any = False
    for g, warm in zip(plan.groups, warm_inputs(graph, plan.groups, conns, A100)):
        read, written = kernel_touches(graph, g, conns)
        for t in warm:
            assert touched.get(t), f"{g.name}: {t} warm, but no earlier kernel wrote it or read all of it"
        assert g.cost.l2_warm == tuple(sorted(warm))
        warm_any |= bool(warm)
        for t, b in read.items():
            touched[t] = touched.get(t, False) or b >= nbytes(graph, t)
        touched.update((t, True) for t in written)
    assert warm_any, "no kernel read anything an earlier one left in L2: the test checks nothing"
    assert plan.dram_bytes >= graph.min_dram_bytes


def test_warm_reads_come_from_l2_and_the_cold_figure_is_kept():
    """Re-costing a kernel with nothing warm gives back its DRAM plus `l2_warm_bytes` and a modeled time no
    shorter; the plan's `dram_bytes_cold` is that sum over kernels."""
    graph, plan = _plan("bert_layer", "unfused")
    conns = {e.key: e.conn for e in plan.edges}
    warm_groups = [g for g in plan.groups if g.cost.l2_warm]
    assert warm_groups
    for g in warm_groups:
        cold = estimate_group(graph, g.stages, conns, g.segments, A100, exact=True)
        assert cold.l2_warm == () and cold.l2_warm_bytes == 0
        assert g.cost.l2_warm_bytes > 0
        assert cold.traffic_bytes["dram"] == g.cost.traffic_bytes["dram"] + g.cost.l2_warm_bytes
        assert cold.modeled_us >= g.cost.modeled_us
    assert plan.dram_bytes_cold == plan.dram_bytes + sum(g.cost.l2_warm_bytes for g in plan.groups)
    assert plan.dram_bytes < plan.dram_bytes_cold


def test_nothing_stays_warm_in_an_l2_too_small_to_hold_it():
    """LRU within the device's L2: with an L2 smaller than any tensor every read is cold; a CPU plan of a
    model its last-level cache holds whole is left as it is (every read is from that cache already)."""
    tiny = dataclasses.replace(A100, l2_bytes=64)
    graph, plan = _plan("bert_layer", "unfused", tiny)
    assert all(g.cost.l2_warm == () for g in plan.groups)
    assert plan.dram_bytes == plan.dram_bytes_cold
    host_like = dataclasses.replace(A100, kind="cpu", l2_bytes=graph.total_bytes)
    assert with_l2_residency(plan, graph, host_like) is plan


def test_lstm_recurrent_weight_stays_in_l2_across_steps():
    """Issue 12 item 5 on the zoo's LSTM (a100, welder): one kernel per two or three time steps, each
    reading the 256 KB recurrent weight. It was charged from DRAM once per step (18.3x the floor): per
    segment inside a kernel, then again in every kernel. Now a kernel pays for an input at most once and a
    weight an earlier kernel read whole is an L2 hit: within 2x the floor, and never under it."""
    graph = load_graph(ROOT.parent / "samples" / "zoo" / "lstm.onnx")
    planned, plan = plan_model(graph, "welder", A100)
    floor = planned.min_dram_bytes
    assert floor <= plan.dram_bytes <= 2 * floor, plan.dram_bytes / floor
    conns = {e.key: e.conn for e in plan.edges}
    for g in plan.groups:  # per kernel with caches cold: each outside input at most once
        read, written = kernel_touches(planned, g, conns)
        assert g.cost.traffic_bytes["dram"] + g.cost.l2_warm_bytes <= sum(nbytes(planned, t) for t in {*read, *written})
    weights = set(planned.weights)
    cold_weight_reads = [t for g in plan.groups for t in kernel_touches(planned, g, conns)[0]
                         if t in weights and t not in g.cost.l2_warm]
    assert len(cold_weight_reads) == len(set(cold_weight_reads)), "a weight read from DRAM by two kernels"


def test_a_host_model_past_its_llc_reads_what_earlier_kernels_left_there():
    """A CPU's last-level cache: where the whole model fits, every read is costed from it and the pass leaves
    the plan alone; past it (real-size models; zoo nerf's 33 MiB on a 32 MiB LLC) reads were all DRAM, even
    of the tensor the kernel before had just written. Now the same LRU pass as a GPU's L2: the same groups
    and tiles, warm inputs written by earlier kernels, each such kernel no slower than it models cold."""
    host = get_device("host")
    graph = load_graph(ROOT / "bert_layer.onnx")
    fits = dataclasses.replace(host, l2_bytes=graph.total_bytes)
    _, plan = plan_model(graph, "unfused", fits)
    assert all(g.cost.l2_warm == () for g in plan.groups)
    small = dataclasses.replace(host, l2_bytes=graph.total_bytes // 2)
    _, warm_plan = plan_model(graph, "unfused", small)
    conns = {e.key: e.conn for e in warm_plan.edges}
    warm_groups = [g for g in warm_plan.groups if g.cost.l2_warm]
    assert len(warm_groups) >= len(warm_plan.groups) // 2, [g.name for g in warm_plan.groups]
    for g in warm_groups:
        cold = estimate_group(graph, g.stages, conns, g.segments, small, exact=True)
        assert cold.traffic_bytes["dram"] == g.cost.traffic_bytes["dram"] + g.cost.l2_warm_bytes
        assert cold.modeled_us >= g.cost.modeled_us
    assert warm_plan.dram_bytes < warm_plan.dram_bytes_cold
