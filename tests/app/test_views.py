"""app/views: Plan → DOT, layers, diff → Markdown, RProgram → figure, tables, cuda-sim result → rows; no Streamlit runtime."""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
import subprocess

import pytest
from support import sample_path

from app.services import SimVerifyResult
from app.views.diff import diff_plans, diff_to_markdown
from app.views.dot import CONN_STYLE, legend_dot, plan_to_dot
from app.views.fmt import fmt_bytes
from app.views.layers import find_layers, matching_edges, repeated_layers
from app.views.simt import simt_finding_rows, simt_traffic_rows, simt_verdict
from app.views.tables import describe_edit, edge_rows, group_detail, model_summary, verdict_text
from app.views.timeline import timeline_figure
from engine.api import load_graph
from engine.rprogram.model import ROperator, RProgram, RTask, Step, Variant, VDevice
from engine.runtime.simt.report import Finding, KernelTraffic
from engine.schedule.plan import Conn, Edit, components
from engine.schedule.policies import make_plan


@pytest.fixture(scope="module")
def bert12():
    return load_graph(sample_path("bert12"))


@pytest.fixture(scope="module")
def gelu():
    return load_graph(sample_path("gelu_chain"))


def fused_plan(graph, fuse: set[tuple[str, str]], conn: Conn = Conn.REGISTER):
    """The unfused plan with the edges in `fuse` set to `conn` and groups recomputed."""
    base = make_plan(graph, "unfused", "a100")
    edges = tuple(dataclasses.replace(e, conn=conn, source="user") if e.key in fuse else e for e in base.edges)
    names = components(graph, {e.key: e.conn for e in edges})
    groups = []
    for k, stages in enumerate(names):
        g = next(g for g in base.groups if g.stages[0] == stages[0])
        groups.append(dataclasses.replace(g, id=k, name=f"k{k:02d}", stages=tuple(stages)))
    return dataclasses.replace(base, edges=edges, groups=tuple(groups))


def test_dot_has_a_cluster_per_group_and_styles_each_connection(gelu):
    rng = random.Random(7)
    fuse = set(rng.sample(list(gelu.edges), 4))
    plan = fused_plan(gelu, fuse, Conn.SHARED)
    dot = plan_to_dot(gelu, plan)
    assert dot.count("subgraph cluster_g") == plan.kernels < len(gelu.stages)
    shared_colour, kernel_colour = CONN_STYLE[Conn.SHARED][0], CONN_STYLE[Conn.KERNEL][0]
    edge_lines = [ln for ln in dot.splitlines() if "->" in ln and "in" not in ln.split("->")[0]]
    assert sum(shared_colour in ln for ln in edge_lines) == len(fuse)
    assert sum(kernel_colour in ln for ln in edge_lines) == len(gelu.edges) - len(fuse)
    assert "128×3072" in dot  # tensor shapes on edges


def test_dot_highlights_the_selection(gelu):
    plan = make_plan(gelu, "unfused", "a100")
    producer, consumer = gelu.edges[2]
    dot = plan_to_dot(gelu, plan, selected_edge=(producer, consumer), selected_group=plan.groups[1].id)
    highlighted = [ln for ln in dot.splitlines() if "#d81b60" in ln]
    assert len(highlighted) == 2 and any(producer in ln for ln in highlighted)


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz 'dot' not installed")
def test_dot_is_valid_graphviz(gelu):
    plan = fused_plan(gelu, set(gelu.edges[:3]), Conn.GLOBAL_SYNC)
    for text in (plan_to_dot(gelu, plan), legend_dot()):
        done = subprocess.run(["dot", "-Tsvg"], input=text.encode(), capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        assert b"<svg" in done.stdout


def test_layers_of_bert12_repeat_and_collapse(bert12):
    layers = [lay for lay in find_layers(bert12) if lay.scope.startswith("encoder.layer.")]
    assert len(layers) == 12
    repeats = repeated_layers(bert12)
    assert [lay.scope for lay in repeats["encoder.layer.0"]] == [f"encoder.layer.{k}" for k in range(1, 12)]
    plan = make_plan(bert12, "unfused", "a100")
    full, collapsed = plan_to_dot(bert12, plan), plan_to_dot(bert12, plan, collapse_layers=True)
    nodes = lambda text: len(re.findall(r"^\s+n\d+ \[", text, flags=re.M))  # noqa: E731
    assert nodes(full) == len(bert12.stages)
    assert nodes(collapsed) == len(bert12.stages) - sum(len(lay.stages) for lay in repeats["encoder.layer.0"])
    assert "11 more layer(s) like encoder.layer.0" in collapsed


def test_matching_edges_find_the_same_edge_in_every_identical_layer(bert12):
    inside = [(p, c) for p, c in bert12.edges if p.startswith("encoder.layer.4/") and c.startswith("encoder.layer.4/")]
    p, c = random.Random(3).choice(inside)
    matches = matching_edges(bert12, p, c)
    assert matches[0] == (p, c) and len(matches) == 12 and len(set(matches)) == 12
    tail = lambda name: name.split("/", 1)[1].split("_")[0]  # noqa: E731  op word without node number
    assert all(tail(mp) == tail(p) and tail(mc) == tail(c) and (mp, mc) in bert12.edges for mp, mc in matches)
    outside = next((p, c) for p, c in bert12.edges if p.startswith("embeddings"))
    assert matching_edges(bert12, *outside) == [outside]


def test_diff_reports_changed_edges_and_kernels_as_markdown(gelu):
    a = make_plan(gelu, "unfused", "a100")
    fuse = set(gelu.edges[:2])
    b = fused_plan(gelu, fuse, Conn.REGISTER)
    d = diff_plans(a, b, "unfused", "edited")
    assert len(d.changed_edges) == 2 and all(row[1:] == ("kernel", "register") for row in d.changed_edges)
    assert dict((m, (x, y)) for m, x, y in d.headline)["kernels"] == (str(a.kernels), str(b.kernels))
    assert len(d.only_b) == b.kernels - (a.kernels - len(d.only_a))
    md = diff_to_markdown(d)
    assert md.startswith("# Plan comparison: unfused vs edited")
    assert "| kernels | 10 | 8 |" in md and "## Edge connections that differ (2)" in md
    same = diff_plans(a, a)
    assert not same.changed_edges and not same.only_a and "none" in diff_to_markdown(same)


def test_timeline_figure_has_one_trace_per_kernel_with_rtask_hover():
    rng = random.Random(11)
    ops = tuple(ROperator(f"k{i:02d}_op", i, (f"s{i}",), (Variant(4, 128, 0, 32, 1.0, "modeled"),))
                for i in range(3))
    veus, t = [], 0.0
    for v in range(4):
        tasks = []
        for op in ops:
            dur = rng.uniform(0.5, 2.0)
            tasks.append(RTask(op.name, v, t, t + dur))
            t += dur
        veus.append(tuple(tasks))
    rp = RProgram("m", "welder", VDevice("a100", 2, 2, "threads", 128, 0, 32), ops, tuple(veus),
                  (Step(0, (0,), tuple(o.name for o in ops), (0, 0, 0), 0.0, t, "one wave"),), 3.0, 1.0, 0.5, 40.0)
    fig = timeline_figure(rp)
    assert [tr.name for tr in fig.data] == [op.name for op in ops]
    first = fig.data[0]
    assert first.x[0] == pytest.approx(rp.launch_us + veus[0][0].start_us)
    assert "k00_op block 0" in first.hovertext[0] and "vEU 0" in first.hovertext[0]
    assert "makespan" in fig.layout.title.text
    assert len(timeline_figure(rp, max_veus=2).data[0].y) == 2 * 3  # rows beyond the cap are left out


def test_summary_and_rows_follow_the_graph(gelu):
    s = model_summary(gelu, {"Mul": 4, "Add": 3})
    assert s["onnx ops"] == 7 and s["stages"] == len(gelu.stages) and s["FLOPs"] == gelu.flops > 0
    assert s["parameters"] == sum(t.size for t in gelu.constants)
    plan = fused_plan(gelu, {gelu.edges[0]})
    rows = edge_rows(gelu, plan)
    assert [r["connection"] for r in rows].count("register") == 1 and len(rows) == len(gelu.edges)
    assert verdict_text(3e-6, 1e-3)[0] and "matches reference, max rel err 3.00e-06" in verdict_text(3e-6, 1e-3)[1]
    assert not verdict_text(0.5, 1e-3)[0]


def test_group_detail_names_the_inputs_read_from_l2(gelu):
    """A kernel of the unfused plan (a100) that reads what the kernel before it wrote says so, with the
    DRAM the residency model saved; the first kernel reads only the model's input, cold."""
    from engine.device import get_device

    plan = make_plan(gelu, "unfused", get_device("a100"))
    key = "read from L2, left by earlier kernels"
    first, warm = plan.groups[0], [g for g in plan.groups if g.cost.l2_warm]
    assert key not in group_detail(gelu, first) and warm
    detail = group_detail(gelu, warm[0])
    assert detail[key].startswith(", ".join(warm[0].cost.l2_warm))
    assert fmt_bytes(warm[0].cost.l2_warm_bytes) in detail[key]



def random_sim_result(rng: random.Random, kinds: list[str], *, stopped: str = "", err: float = 2.5e-6):
    """A SimVerifyResult with random traffic per kernel and a finding of each kind in `kinds`."""
    kernels = tuple(KernelTraffic(f"k{k:02d}_op", rng.randint(1, 3), *(rng.randint(1, 10**7) for _ in range(4)),
                                  modeled={"l2": rng.randint(1, 10**7), "dram": rng.randint(1, 10**7),
                                           "shared": rng.randint(0, 10**6)})
                    for k in range(rng.randint(2, 6)))
    findings = tuple(Finding(kind, rng.choice(kernels).kernel, "k00_op.cu", rng.randint(1, 200),
                             f"    s_x[t] = g_y[{rng.randint(0, 9)}];", (rng.randint(0, 9), 0, 0),
                             (rng.randint(0, 31), 0, 0), "g_y", f"{kind} at a line", rng.randint(1, 50))
                     for kind in kinds)
    match = err <= 1e-3
    return SimVerifyResult(not findings and not stopped and match, match, err, rng.randint(1, 20), 21, stopped,
                           findings, kernels, rng.uniform(0.1, 5.0))


def test_simt_rows_follow_the_result():
    rng = random.Random(13)
    clean = random_sim_result(rng, [])
    ok, text = simt_verdict(clean, 1e-3)
    assert ok and text == f"cuda-sim: {clean.launches} launch{'es' if clean.launches != 1 else ''}, no findings, " \
                          f"outputs match (max rel err {clean.max_rel_err:.2e})"
    assert simt_finding_rows(clean) == []
    rows = simt_traffic_rows(clean)
    assert [r["kernel"] for r in rows] == [k.kernel for k in clean.kernels]
    for row, k in zip(rows, clean.kernels):
        assert row["global loaded"] == fmt_bytes(k.global_load_bytes)
        assert row["global stored"] == fmt_bytes(k.global_store_bytes)
        assert row["shared moved"] == fmt_bytes(k.shared_load_bytes + k.shared_store_bytes)
        assert (row["modeled L2"], row["modeled DRAM"]) == (fmt_bytes(k.modeled["l2"]), fmt_bytes(k.modeled["dram"]))
        assert row["emulated / modeled L2"] == pytest.approx(
            (k.global_load_bytes + k.global_store_bytes) / k.modeled["l2"], abs=1e-3)

    broken = random_sim_result(rng, ["race", "out_of_range", "race"], err=0.4)
    ok, text = simt_verdict(broken, 1e-3)
    assert not ok and "findings: 1 out_of_range, 2 race" in text  # counted per kind, in the engine's order
    assert "outputs do NOT match (max rel err 4.00e-01 > tolerance 1e-03)" in text
    rows = simt_finding_rows(broken)
    assert [r["kind"] for r in rows] == ["race", "out_of_range", "race"]
    first = broken.findings[0]
    assert rows[0]["line"] == f"k00_op.cu:{first.line}" and rows[0]["source"] == first.source.strip()
    assert rows[0]["count"] == first.count and rows[0]["description"] == first.describe()

    stuck = random_sim_result(rng, ["deadlock"], stopped="k01_op: threads wait at line 9")
    assert f"{stuck.launches} launch" in simt_verdict(stuck, 1e-3)[1]
    assert "of 21 (stopped: k01_op: threads wait at line 9), findings: 1 deadlock" in simt_verdict(stuck, 1e-3)[1]
    no_model = KernelTraffic("k09", 1, 10, 20, 0, 0)
    row = simt_traffic_rows(dataclasses.replace(clean, kernels=(no_model,)))[0]
    assert row["modeled L2"] == "—" and row["emulated / modeled L2"] is None


def test_kernel_source_is_clipped_to_its_first_lines():
    from app.views.kernels import clip_source

    rng = random.Random(11)
    lines = [f"line {k} {rng.random():.6f}\n" for k in range(rng.randint(320, 900))]
    shown, hidden = clip_source("".join(lines), 300)
    assert shown == "".join(lines[:300]) and hidden == len(lines) - 300
    assert clip_source("".join(lines[:40]), 300) == ("".join(lines[:40]), 0)


def test_set_tile_edits_name_their_k_step():
    with_step = Edit.make("set_tile", stage="mm", shape=[99, 64], threads=256, reduce_step=[197])
    assert describe_edit(with_step).endswith("256 threads, k step 197")
    assert "k step" not in describe_edit(Edit.make("set_tile", stage="mm", shape=[99, 64], threads=256))
    mapped = Edit.make("set_tile", stage="mm", shape=[99, 64], threads=256, thread_shape=[16, 16])
    assert describe_edit(mapped).endswith("256 threads, threads 16×16 (ty x tx)")
