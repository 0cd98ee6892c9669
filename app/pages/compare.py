"""Compare page: two plans of the model side by side (policies, the edited plan, or a saved plan
JSON): each plan's kernel overview with what differs from the other highlighted and per-kernel deltas,
headline numbers, per-group differences, Markdown export."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.ui import current_model, current_plan, guarded
from app.views.diff import diff_plans, diff_to_markdown
from app.views.overview import build_overview, diff_overview, overlay_values, overview_dot, overview_figure

st.title("Compare")
CURRENT = "current plan (with edits)"
SAVED = "saved plan JSON…"

with guarded("Comparing plans"):
    state, loaded = current_model()
    graph = loaded.graph
    options = [CURRENT, *services.policies(), SAVED]

    def pick(column, label: str, default: int):
        choice = column.selectbox(label, options, index=default, key=f"cmp_{label}")
        if choice == CURRENT:
            planned = current_plan(state, loaded)
            return choice, planned.plan, planned.graph
        if choice == SAVED:
            upload = column.file_uploader(f"Plan JSON or bundle .zip for {label}", type=["json", "zip"],
                                          key=f"cmp_file_{label}")
            if upload is None:
                return choice, None, None
            with st.spinner(f"Replaying {upload.name} on {state.model_name}…"):
                on, plan = services.read_plan_json(upload.getvalue(), graph)
            return upload.name, plan, on
        with st.spinner(f"Planning {state.model_name} with {choice} (once per model and policy)…"):
            planned = services.build_plan(graph, state.model_hash, choice, state.device, "[]", state.batching)
        return choice, planned.plan, planned.graph

    left, right = st.columns(2)
    a_label, a, a_graph = pick(left, "A", 0)
    b_label, b, b_graph = pick(right, "B", 1 if len(options) > 2 else 0)
    if a is None or b is None:
        st.info("Upload the saved plan JSON to compare it.")
        st.stop()
    runs = [services.cached_run(graph, p, state.model_hash, p.plan_hash, state.device, state.backend,
                                state.model_path) for p in (a, b)]
    diff = diff_plans(a, b, a_label, b_label, tuple(r.total_us if r else None for r in runs))
    st.dataframe(pd.DataFrame(diff.headline, columns=["metric", a_label, b_label]), hide_index=True,
                 width="stretch")
    st.subheader("On the graph")
    st.caption("Orange: kernels whose stages are grouped or connected differently in the other plan, and "
               "edges between kernels that the other plan connects differently. Colour: modeled time (µs).")
    # Only the open tab's overview is laid out, sent and drawn (a click on the other reruns the page):
    # two plotly overviews of a large unfused plan cost the browser tab 3-4 s of main-thread work at
    # load 15 (lstm, mobilevit; bench_app_browser --probe).
    tabs = st.tabs([f"A: {a_label}", f"B: {b_label}"], key="cmp_graph_tab", on_change="rerun")
    for k, (tab, (plan, on, other, other_label)) in enumerate(zip(
            tabs, [(a, a_graph, b, b_label), (b, b_graph, a, a_label)])):
        if tab.open is False:
            continue
        with tab:
            with st.spinner("Laying out the kernels (Graphviz; once per plan)…"):
                ov = build_overview(on, plan)
                marks = diff_overview(ov, plan, other)
                positions = services.layout_positions(plan.plan_hash, True, overview_dot(ov))
            st.plotly_chart(overview_figure(ov, positions, plan, values=overlay_values(plan, "modeled time"),
                                            changed_nodes=marks.changed_nodes, changed_edges=marks.changed_edges),
                            key=f"cmp_graph_{k}_{plan.plan_hash}", config={"scrollZoom": True, "displaylogo": False})
            st.caption(f"{len(marks.changed_nodes)} of {len(ov.nodes)} kernel node(s) and "
                       f"{len(marks.changed_edges)} of {len(ov.edges)} kernel edge(s) differ from "
                       f"{other_label}")
            st.dataframe(pd.DataFrame(marks.rows), hide_index=True, width="stretch", key=f"cmp_rows_{k}_{plan.plan_hash}")
    c1, c2 = st.columns(2)
    c1.caption(f"Kernels only in {a_label}")
    c1.dataframe(pd.DataFrame({"kernel": diff.only_a}), hide_index=True, width="stretch")
    c2.caption(f"Kernels only in {b_label}")
    c2.dataframe(pd.DataFrame({"kernel": diff.only_b}), hide_index=True, width="stretch")
    st.caption("Same stages, different tile or cost")
    st.dataframe(pd.DataFrame(diff.changed_groups, columns=["kernel", a_label, b_label]), hide_index=True,
                 width="stretch")
    st.caption("Edge connections that differ")
    st.dataframe(pd.DataFrame(diff.changed_edges, columns=["edge", a_label, b_label]), hide_index=True,
                 width="stretch")
    st.download_button("Export diff as Markdown", diff_to_markdown(diff), file_name="plan_diff.md",
                       mime="text/markdown", key="cmp_md")
