"""app/views/overview.py: Plan → kernel overview (nodes, folded repeats, kernel edges), layout parsing,
the plotly figure and its click mapping, overlays, search, and the compare marks; no Streamlit runtime."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest
from support import sample_path

from app.views.overview import (
    OVERLAYS,
    build_overview,
    diff_overview,
    neighbour_groups,
    overlay_values,
    overview_dot,
    overview_figure,
    parse_plain,
    pick_from_selection,
    repeat_runs,
    search_stages,
)
from engine.api import load_graph, plan_model
from engine.schedule.policies import make_plan


@pytest.fixture(scope="module")
def bert12():
    return plan_model(load_graph(sample_path("bert12")), "welder", "a100")


@pytest.fixture(scope="module")
def softmax():
    graph = load_graph(sample_path("masked_softmax"))
    return graph, make_plan(graph, "welder", "a100"), make_plan(graph, "unfused", "a100")


def test_every_kernel_is_one_node_and_edges_join_different_kernels(softmax):
    graph, plan, _ = softmax
    ov = build_overview(graph, plan, fold_repeats=False)
    assert [n.groups for n in ov.nodes] == [(g.id,) for g in plan.groups]
    group_at = {s: g.id for g in plan.groups for s in g.stages}
    crossing = {e.key for e in plan.edges if group_at[e.producer] != group_at[e.consumer]}
    assert {pair for e in ov.edges for pair in e.stage_edges} == crossing
    for e in ov.edges:
        assert e.src != e.dst and e.nbytes == sum(graph.specs[t].nbytes for t in {p for p, _ in e.stage_edges})


def test_stacked_layers_fold_into_x_n_nodes(bert12):
    graph, plan = bert12
    ov = build_overview(graph, plan)
    assert len(ov.nodes) < plan.kernels / 4
    assert max(n.repeat for n in ov.nodes) >= 11
    # every group stands behind exactly one node, folded nodes' copies share the first's signature
    assert sorted(g for n in ov.nodes for g in n.groups) == sorted(g.id for g in plan.groups)
    assert any(n.key.endswith("x11") for n in ov.nodes)


def test_repeat_runs_finds_the_period_of_a_repeated_block():
    rng = random.Random(7)
    head = [f"h{rng.randrange(1000)}" for _ in range(3)]
    block = ["a", "b", "c", "d"]
    sigs = head + block * 5 + ["tail"]
    runs = repeat_runs(sigs)
    assert (3, 4, 5) in runs
    assert sum(p * n for _, p, n in runs) == len(sigs)


def test_layout_positions_from_graphviz_plain_output(softmax):
    if not shutil.which("dot"):
        pytest.skip("graphviz 'dot' not installed")
    graph, plan, _ = softmax
    ov = build_overview(graph, plan)
    text = subprocess.run(["dot", "-Tplain"], input=overview_dot(ov).encode(), capture_output=True,
                          check=True).stdout.decode()
    pos = parse_plain(text)
    assert set(pos) == {n.key for n in ov.nodes}
    for e in ov.edges:  # rankdir TB: a producer sits above its consumer (y grows upwards)
        assert pos[e.src][1] > pos[e.dst][1]


def test_layout_of_a_long_unfused_plan_stays_small_for_dot():
    """An edge spanning many ranks gives dot a virtual node per rank crossed: placing lstm's 99 unfused
    kernels took 9,500 virtual nodes and 13,000 network-simplex iterations (6 s here, 70 s for the zoo
    lstm's 199). The overview's DOT lets edges from one kernel share their path and caps the iterations at
    two per node (`dot -v` reports both counts); every node is still placed, producers above consumers."""
    import re

    if not shutil.which("dot"):
        pytest.skip("graphviz 'dot' not installed")
    graph = load_graph(sample_path("lstm"))
    ov = build_overview(graph, make_plan(graph, "unfused", "a100"))
    done = subprocess.run(["dot", "-v", "-Tplain"], input=overview_dot(ov).encode(), capture_output=True, check=True)
    passes = re.findall(r"network simplex: +(\d+) nodes +\d+ edges +(\d+) iter", done.stderr.decode())
    assert len(passes) == 2  # ranking, then x placement (over the virtual nodes too)
    assert int(passes[1][0]) < 15 * len(ov.nodes)
    assert int(passes[1][1]) <= 2 * len(ov.nodes)
    pos = parse_plain(done.stdout.decode())
    assert set(pos) == {n.key for n in ov.nodes}
    assert all(pos[e.src][1] > pos[e.dst][1] for e in ov.edges)


def test_figure_points_map_back_to_kernels_and_edges(softmax):
    graph, plan, _ = softmax
    ov = build_overview(graph, plan, fold_repeats=False)
    pos = {n.key: (float(k), float(-k)) for k, n in enumerate(ov.nodes)}
    fig = overview_figure(ov, pos, plan, values=overlay_values(plan, "modeled time"), selected=ov.nodes[0].key)
    kernels = next(k for k, t in enumerate(fig.data) if t.name == "kernels")
    edges = next(k for k, t in enumerate(fig.data) if t.name == "edges")
    last = len(ov.nodes) - 1
    assert pick_from_selection(fig, {"points": [{"curve_number": kernels, "point_index": last}]}) == \
        ("kernel", ov.nodes[last].key)
    if ov.edges:
        assert pick_from_selection(fig, {"points": [{"curve_number": edges, "point_index": 0,
                                                     "customdata": 0}]}) == ("edge", 0)
    assert pick_from_selection(fig, {"points": []}) is None
    bar = fig.data[kernels].marker.colorbar.title.text
    assert "µs" in bar and "modeled time" in bar


def test_overlays_use_measured_numbers_when_given(softmax):
    _, plan, _ = softmax
    rng = random.Random(3)
    measured = {g.name: rng.uniform(1, 100) for g in plan.groups}
    assert overlay_values(plan, "measured time") == {}
    got = overlay_values(plan, "measured time", measured)
    assert got == {g.id: measured[g.name] for g in plan.groups}
    ratio = overlay_values(plan, "measured / modeled", measured)
    for g in plan.groups:
        assert ratio[g.id] == pytest.approx(measured[g.name] / g.cost.modeled_us)
    dram = overlay_values(plan, "DRAM bytes")
    assert all(dram[g.id] == g.cost.traffic_bytes["dram"] / 2**20 for g in plan.groups)
    assert set(OVERLAYS) >= {"modeled time", "measured time", "measured / modeled", "DRAM bytes",
                             "recompute factor", "emulated traffic"}


def test_search_finds_the_kernel_of_an_onnx_node(softmax):
    graph, plan, _ = softmax
    stage = graph.stages[len(graph.stages) // 2]
    node = stage.origin[0]
    hits = search_stages(graph, plan, node.upper())
    assert (f"{stage.name}  (ONNX {node})", plan.group_of(stage.name).name) in hits or \
        any(t.startswith(stage.name) for t, _ in hits)
    assert search_stages(graph, plan, "no-such-node-xyz") == []


def test_neighbours_are_the_groups_an_edge_touches(softmax):
    _, plan, unfused = softmax
    g = unfused.groups[1]
    near = neighbour_groups(unfused, g.id)
    members = set(g.stages)
    expect = {g.id} | {unfused.group_of(e.consumer).id for e in unfused.edges if e.producer in members} | \
        {unfused.group_of(e.producer).id for e in unfused.edges if e.consumer in members}
    assert near == expect and len(near) > 1


def test_compare_marks_what_the_other_plan_does_differently(softmax):
    graph, welder, unfused = softmax
    ov_u = build_overview(graph, unfused, fold_repeats=False)
    marks = diff_overview(ov_u, unfused, welder)
    fused = {e.key for e in welder.edges if e.conn.fused}
    expect = {k for k, e in enumerate(ov_u.edges) if set(e.stage_edges) & fused}
    assert marks.changed_edges == expect and expect
    same = diff_overview(ov_u, unfused, unfused)
    assert not same.changed_edges and not same.changed_nodes
    assert all(r["Δ µs (B − A)"] == 0 for r in same.rows)
    ov_w = build_overview(graph, welder, fold_repeats=False)
    assert diff_overview(ov_w, welder, unfused).changed_nodes  # welder's fused kernels are split in unfused


def test_roofline_shows_measured_points_beside_modeled(softmax):
    from app.views.roofline import roofline_figure, roofline_points
    from engine.device import get_device

    _, plan, _ = softmax
    rng = random.Random(9)
    measured = {g.name: rng.uniform(1, 100) for g in plan.groups[:2]}
    points = roofline_points(plan, "dram", measured)
    modeled = [p for p in points if p["source"] == "modeled"]
    ran = [p for p in points if p["source"] == "measured"]
    assert len(modeled) == sum(1 for g in plan.groups if g.cost and g.cost.traffic_bytes.get("dram") and g.cost.flops)
    assert {p["kernel"] for p in ran} <= set(measured) and ran
    for p in ran:
        g = next(g for g in plan.groups if g.name == p["kernel"])
        assert p["flops_per_s"] == pytest.approx(g.cost.flops / (measured[g.name] * 1e-6))
        assert p["intensity"] == next(m["intensity"] for m in modeled if m["kernel"] == g.name)
    names = [t.name for t in roofline_figure(plan, get_device("a100"), "dram", measured).data]
    assert "modeled" in names and "measured" in names
