"""Every page under streamlit.testing AppTest: no exception, key widgets present, plan edits
(accepted ones change the plan, refused ones show their reason), and the Kernels page's SIMT-emulator
verification (a clean run; an engine error as one line)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import services
from app.state import KEY
from app.views.fmt import fmt_bytes
from app.views.kernels import kernel_sources
from app.views.simt import FINDING_COLUMNS
from engine.errors import BackendError

APP = str(Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py")
PAGES = ["model", "tilegraph", "plan", "kernels", "timeline", "compare", "export"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))


def open_page(page: str, sample: str = "gelu_chain") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.selectbox(key="sample").set_value(sample).run()
    if page != "model":
        at.switch_page(f"pages/{page}.py").run()
    return at


def no_traceback(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    unexpected = [e.value for e in at.error if "failed unexpectedly" in e.value]
    assert not unexpected, unexpected


def test_model_page_shows_default_sample_summary_and_cpu_note():
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    no_traceback(at)
    assert at.selectbox(key="sample").value == services.default_sample()["name"]
    labels = [m.label for m in at.metric]
    assert {"ONNX ops", "Primitive stages", "FLOPs", "Min DRAM traffic"} <= set(labels)
    assert at.selectbox(key="device").value == "a100"
    assert any("CPU backend" in i.value for i in at.info)  # no GPU in the test environment


def test_host_device_plans_for_this_cpu_on_every_page():
    at = open_page("model")
    at.selectbox(key="device").set_value("host").run()
    no_traceback(at)
    assert any("plans and modeled times are for this CPU" in i.value for i in at.info)
    at.switch_page("pages/plan.py").run()
    no_traceback(at)
    assert "device host" in at.caption[0].value
    for page in ("kernels", "timeline"):
        at.switch_page(f"pages/{page}.py").run()
        no_traceback(at)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_without_exception(page):
    at = open_page(page)
    no_traceback(at)
    assert at.title[0].value.lower().replace("-", "") == page.replace("tilegraph", "tilegraph")


def select(at: AppTest, *selection: str) -> None:
    """What a click in the overview does (its on_select callback): store the selection by stage names."""
    at.session_state[KEY] = dataclasses.replace(at.session_state[KEY], selection=selection)
    at.run()


def test_tilegraph_draws_the_kernel_overview_not_every_stage():
    at = open_page("tilegraph", "bert_layer")
    no_traceback(at)
    assert not at.get("graphviz_chart"), "the stage-level graph must not be drawn by default"
    assert any("node(s) for" in c.value for c in at.caption)
    at.button(key="tg_draw_all").click().run()
    no_traceback(at)
    assert at.get("graphviz_chart")


def test_a_clicked_kernel_shows_its_stages_details_and_edits():
    at = open_page("tilegraph", "masked_softmax")
    graph = services.load_model(str(services.sample_path("masked_softmax")), "masked_softmax").graph
    plan = services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", True).plan
    group = plan.groups[-1]
    select(at, "kernel", group.stages[-1])
    no_traceback(at)
    assert group.name in [h.value for h in at.subheader]
    assert f"Stages of {group.name} and its neighbours" in [h.value for h in at.subheader]
    assert at.get("graphviz_chart") and at.json
    for key in ("tg_tile", "tg_threads"):
        assert at.text_input(key=key) if key == "tg_tile" else at.number_input(key=key)
    # the k step is shown and edited with the tile: applying a tile keeps the searched step
    assert at.text_input(key="tg_kstep").value == "x".join(map(str, group.segments[0].reduce_step))
    assert at.text_input(key="tg_tmap").value == "x".join(map(str, group.segments[0].thread_shape))


def test_a_kernels_thread_mapping_is_shown_and_edited():
    """vit_block's 197 tokens: a 50 x 32 GEMM tile on 224 threads whose plan records its mapping; the
    Tile-graph editor shows it and applies another (the edit names it, the new plan runs it)."""
    at = open_page("tilegraph", "vit_block")
    graph = services.load_model(str(services.sample_path("vit_block")), "vit_block").graph
    plan = services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", True).plan
    group = next(g for g in plan.groups if len(g.segments) == 1 and g.segments[0].thread_shape)
    select(at, "kernel", group.stages[-1])
    no_traceback(at)
    tile = group.segments[0]
    was = "x".join(map(str, tile.thread_shape))
    assert at.text_input(key="tg_tmap").value == was
    other = next(m for m in (f"{tile.threads // tx}x{tx}" for tx in (16, 8, 4)) if m != was)
    at.text_input(key="tg_tmap").set_value(other)
    at.button[[b.label for b in at.button].index("Apply tile")].click().run()
    no_traceback(at)
    (edit,) = at.session_state[KEY].edits
    assert edit.arg["thread_shape"] == tuple(int(x) for x in other.split("x"))
    select(at, "kernel", group.stages[-1])
    assert at.text_input(key="tg_tmap").value == other


def test_an_edge_clicked_in_the_overview_offers_legal_connections_and_undo_restores():
    at = open_page("plan", "masked_softmax")
    at.selectbox(key="plan_policy").set_value("unfused").run()
    at.switch_page("pages/tilegraph.py").run()
    graph = services.load_model(str(services.sample_path("masked_softmax")), "masked_softmax").graph
    plan = services.build_plan(graph, graph.structural_hash, "unfused", "a100", "[]", True).plan
    before = at.caption[0].value
    # Fusing Add → exp alone would put the two kernels on a cycle through the max reduction (illegal);
    # another edge is legal at register.
    illegal = next(e for e in plan.edges if e.producer == "Add_6_out" and e.consumer == "probs::exp")
    select(at, "edge", illegal.producer, illegal.consumer)
    no_traceback(at)
    assert at.button(key="tg_conn_register").disabled
    assert any(c.value.startswith(":grey[register: ") and "rule" in c.value for c in at.caption)
    for e in plan.edges:
        select(at, "edge", e.producer, e.consumer)
        if not at.button(key="tg_conn_register").disabled:
            break
    else:
        pytest.fail("no edge of unfused masked_softmax can be fused at register")
    at.button(key="tg_conn_register").click().run()
    no_traceback(at)
    assert "1 edit(s)" in at.caption[0].value and at.caption[0].value != before
    at.button(key="tg_undo").click().run()
    assert at.caption[0].value == before
    at.button(key="tg_redo").click().run()
    assert "1 edit(s)" in at.caption[0].value


def test_search_selects_the_kernel_holding_an_onnx_node():
    at = open_page("tilegraph", "masked_softmax")
    graph = services.load_model(str(services.sample_path("masked_softmax")), "masked_softmax").graph
    stage = graph.stages[2]
    at.text_input(key="tg_search").set_value(stage.origin[0]).run()
    at.button(key="tg_hit_go").click().run()
    no_traceback(at)
    plan = services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", True).plan
    assert plan.group_of(stage.name).name in [h.value for h in at.subheader]


def test_switching_sample_changes_the_summary():
    at = open_page("model", "masked_softmax")
    stages = next(m.value for m in at.metric if m.label == "Primitive stages")
    at.selectbox(key="sample").set_value("layernorm_residual").run()
    assert next(m.value for m in at.metric if m.label == "Primitive stages") != stages


def test_an_edge_edit_changes_the_plan_and_undo_restores_it():
    at = open_page("plan")
    at.selectbox(key="plan_policy").set_value("unfused").run()
    before = at.caption[0].value
    edge = at.selectbox(key="plan_edge")
    # Inside a form, values count only when submitted together with the button click.
    edge.set_value(edge.options[0].split("  [")[0])
    at.selectbox(key="plan_conn").set_value("register")
    at.button[0].click().run()  # the form's submit button
    no_traceback(at)
    assert not [e.value for e in at.error if e.value.startswith("Refused")]
    assert "1 edit(s)" in at.caption[0].value and at.caption[0].value != before
    at.button(key="plan_undo").click().run()
    assert at.caption[0].value == before


def test_an_illegal_edit_shows_the_rule_it_breaks():
    at = open_page("plan", "masked_softmax")
    at.selectbox(key="plan_policy").set_value("unfused").run()
    edge = at.selectbox(key="plan_edge")
    # Fusing Add → exp alone would put the two kernels on a cycle through the max reduction.
    # options are the formatted labels ("p → c  [conn]"); the value is the bare "p → c".
    target = next(o for o in edge.options if o.startswith("Add_6_out → probs::exp")).split("  [")[0]
    edge.set_value(target)
    at.selectbox(key="plan_conn").set_value("register")
    at.button[0].click().run()
    no_traceback(at)
    refused = [e.value for e in at.error if e.value.startswith("Refused")]
    assert refused and "illegal" in refused[0] and "rule" in refused[0]
    assert "0 edit(s)" in at.caption[0].value


def decisions_table(at: AppTest):
    return next(d.value for d in at.dataframe if "kind" in d.value.columns)


def test_welder_batches_qkv_and_the_toggle_turns_it_off():
    at = open_page("plan", "bert_layer")
    no_traceback(at)
    assert at.selectbox(key="plan_policy").value == "welder" and at.toggle(key="plan_batching").value
    assert "1 batched contraction set(s)" in at.caption[0].value
    rows = decisions_table(at)
    first = rows.iloc[0]
    assert first["kind"] == "batching" and "batched into" in first["decision"] and "MatMul_15_out" in first["decision"]
    edges = at.selectbox(key="plan_edge").options
    assert any(".batched" in o for o in edges)  # edits are offered on the batched graph
    kernels_on = at.caption[0].value.split(" kernels")[0]
    at.toggle(key="plan_batching").set_value(False).run()
    no_traceback(at)
    assert "batched contraction" not in at.caption[0].value
    assert not (decisions_table(at)["kind"] == "batching").any()
    assert not any(".batched" in o for o in at.selectbox(key="plan_edge").options)
    assert at.caption[0].value.split(" kernels")[0] != kernels_on
    at.selectbox(key="plan_policy").set_value("stitch").run()
    assert at.toggle(key="plan_batching").disabled


def test_batched_plan_reaches_the_tilegraph_and_kernels_pages():
    at = open_page("tilegraph", "bert_layer")
    no_traceback(at)
    graph = services.load_model(str(services.sample_path("bert_layer")), "bert_layer").graph
    batched = services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", True).graph
    stage = next(s.name for s in batched.stages if s.name.endswith(".batched"))
    select(at, "kernel", stage)
    no_traceback(at)
    assert any(stage in str(j.value) for j in at.json)  # the kernel holding the batched stage opens
    at.switch_page("pages/kernels.py").run()
    no_traceback(at)
    graph = services.load_model(str(services.sample_path("bert_layer")), "bert_layer").graph
    on, off = (services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", b).plan for b in (True, False))
    on_graph = services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", True).graph
    assert len(at.dataframe[0].value) == on.kernels != off.kernels  # the table lists the batched plan's kernels
    holder = on.group_of(next(s.name for s in on_graph.stages if s.name.endswith(".batched"))).name
    at.selectbox(key="kernels_source_pick").set_value(holder).run()
    assert any("batched" in c.value for c in at.code)  # generated source names the batched stage
    assert all(len(c.value) < len(services.kernel_sources(on_graph, on, graph.structural_hash, on.plan_hash,
                                                          "a100")["c"]) for c in at.code)  # one kernel shown


def test_kernels_page_shows_a_long_kernels_first_lines_unless_asked_for_all():
    from app.views.kernels import SOURCE_LINES_SHOWN

    # bert12: the walk's plan, with long grid-barrier kernels (bert_layer's welder plan on a100 is the stitch
    # plan, which models faster, and has no kernel this long)
    at = open_page("kernels", "bert12")
    no_traceback(at)
    graph = services.load_model(str(services.sample_path("bert12")), "bert12").graph
    planned = services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", True)
    sources = services.kernel_sources(planned.graph, planned.plan, graph.structural_hash, planned.plan.plan_hash, "a100")
    longest = max(planned.plan.groups, key=lambda g: len(kernel_sources(sources["c"])[g.name].splitlines())).name
    assert len(kernel_sources(sources["c"])[longest].splitlines()) > SOURCE_LINES_SHOWN
    at.selectbox(key="kernels_source_pick").set_value(longest).run()
    assert all(len(c.value.splitlines()) <= SOURCE_LINES_SHOWN for c in at.code)
    assert any("more lines" in c.value for c in at.caption)
    at.toggle(key="kernels_source_whole").set_value(True).run()
    assert kernel_sources(sources["c"])[longest].rstrip() in [c.value.rstrip() for c in at.code]


def simt_table(at: AppTest, column: str):
    """The SIMT-emulator table on the Kernels page that has `column`, or None before a verification."""
    return next((d.value for d in at.dataframe if column in d.value.columns), None)


def test_kernels_page_verifies_the_plan_on_the_simt_emulator():
    # masked_softmax unfused: 7 small kernels, under a second in the emulator (tests/engine/runtime/simt run it too)
    at = open_page("plan", "masked_softmax")
    at.selectbox(key="plan_policy").set_value("unfused").run()
    at.switch_page("pages/kernels.py").run()
    no_traceback(at)
    assert simt_table(at, "emulated / modeled L2") is None  # nothing runs before the click
    at.button(key="kernels_simt").click().run()
    no_traceback(at)
    graph = services.load_model(str(services.sample_path("masked_softmax")), "masked_softmax").graph
    plan = services.build_plan(graph, graph.structural_hash, "unfused", "a100", "[]", True).plan
    verdict = [s.value for s in at.success if s.value.startswith("cuda-sim:")]
    assert len(verdict) == 1 and verdict[0].startswith(f"cuda-sim: {plan.kernels} launches, no findings, outputs match")
    findings = simt_table(at, "description")
    assert findings is not None and findings.empty and list(findings.columns) == list(FINDING_COLUMNS)
    traffic = simt_table(at, "emulated / modeled L2")
    assert list(traffic["kernel"]) == [g.name for g in plan.groups]  # one row per kernel
    assert list(traffic["modeled L2"]) == [fmt_bytes(g.cost.traffic_bytes["l2"]) for g in plan.groups]
    assert (traffic["emulated / modeled L2"] > 0).all()
    assert any("emulated counts of the printed CUDA" in c.value and "remain modeled" in c.value for c in at.caption)
    at.run()  # a rerun shows the last verification of this plan without running it again
    assert [s.value for s in at.success if s.value.startswith("cuda-sim:")] == verdict


def test_a_simt_engine_error_shows_one_line_not_a_traceback(monkeypatch):
    def refuse(*args, **kwargs):
        raise BackendError("cuda-sim: no C++ compiler found: install g++")

    monkeypatch.setattr(services.api, "run_model", refuse)
    monkeypatch.setattr(services, "_SIMS", {})
    at = open_page("kernels")
    at.button(key="kernels_simt").click().run()
    no_traceback(at)
    assert [e.value for e in at.error] == ["cuda-sim: no C++ compiler found: install g++"]
    assert not [s.value for s in at.success if s.value.startswith("cuda-sim:")]
    assert simt_table(at, "emulated / modeled L2") is None
    assert not at.expander or all(e.label != "Details" for e in at.expander)


def test_a_run_past_its_time_limit_is_one_line_and_keeps_the_earlier_results(monkeypatch):
    monkeypatch.setattr(services, "_RUNS", {})  # nothing run yet in this process
    at = open_page("plan")
    at.selectbox(key="plan_policy").set_value("unfused").run()
    at.switch_page("pages/kernels.py").run()
    at.number_input(key="kernels_run_limit").set_value(300.0).run()
    at.button(key="kernels_run").click().run()
    no_traceback(at)
    assert [s.value for s in at.success if "matches reference" in s.value]
    # Another plan (an edit's worth of change: the stitch policy), a limit no compile meets: refused in one
    # line, nothing stored; the plan page still has the plan and the unfused plan its result.
    at.switch_page("pages/plan.py").run()
    at.selectbox(key="plan_policy").set_value("stitch").run()
    at.switch_page("pages/kernels.py").run()
    at.number_input(key="kernels_run_limit").set_value(0.01).run()
    at.button(key="kernels_run").click().run()
    no_traceback(at)
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "did not finish within the 0.01 s time limit" in errors[0], errors
    assert "earlier results are unchanged" in errors[0]
    assert not [s.value for s in at.success if "matches reference" in s.value]
    assert len(services._RUNS) == 1
    at.switch_page("pages/plan.py").run()
    assert at.selectbox(key="plan_policy").value == "stitch"
    at.selectbox(key="plan_policy").set_value("unfused").run()
    at.switch_page("pages/kernels.py").run()
    assert [s.value for s in at.success if "matches reference" in s.value]  # the earlier result, not re-run
    at.button(key="kernels_simt_cancel").click().run()
    assert "Nothing is running." in [i.value for i in at.info]



def test_compare_draws_the_overview_of_the_open_tab_only():
    """Two large overviews cost the browser seconds: the closed tab's is neither laid out nor sent; opening
    it (a rerun) draws that plan's, marked against the other."""
    at = open_page("compare")
    no_traceback(at)
    differ = lambda: [c.value for c in at.caption if "differ from" in c.value]  # noqa: E731
    assert len(at.get("plotly_chart")) == 1 and len(differ()) == 1 and differ()[0].endswith("differ from unfused")
    at.session_state["cmp_graph_tab"] = at.tabs[1].label  # what a click on the tab sets
    at.run()
    no_traceback(at)
    assert len(at.get("plotly_chart")) == 1 and len(differ()) == 1
    assert differ()[0].endswith("differ from current plan (with edits)")


def test_a_second_session_plans_from_the_schedule_cache(tmp_path, monkeypatch):
    """With the schedule cache on (as for a user; the suite runs it off), the workbench writes the tile
    search's answers after a plan, and after a restart (Streamlit's caches and the memo tables cleared) a
    new browser session plans the same model from them: no tile search runs, and the page shows the
    same plan (its caption and decision log)."""
    import streamlit as st

    from engine import memo
    from engine.schedule import tiles

    def restart():  # a new server process: no plan in Streamlit's caches, no memo table in the process
        st.cache_resource.clear()
        st.cache_data.clear()
        memo.PROCESS.clear()

    monkeypatch.setenv("TILEWEAVE_SCHEDULE_CACHE", "on")
    restart()  # an earlier test in this process may have planned the model already
    first = open_page("plan", "bert_layer")
    no_traceback(first)
    assert list((tmp_path / "schedule").glob("*.pkl")), "the plan's searches were not written"
    restart()
    searched = []
    search = tiles._search_pass
    monkeypatch.setattr(tiles, "_search_pass", lambda *a, **k: searched.append(1) or search(*a, **k))
    second = open_page("plan", "bert_layer")
    no_traceback(second)
    assert not searched
    assert [c.value for c in second.caption] == [c.value for c in first.caption]
    decisions = [d.value for d in first.dataframe if "decision" in d.value.columns]
    assert decisions and decisions[0].equals([d.value for d in second.dataframe if "decision" in d.value.columns][0])
