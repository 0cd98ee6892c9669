"""Tile-graph page: the kernel-level overview (one node per kernel, repeated kernels folded ×N,
Graphviz layout drawn with plotly: zoom, pan, click), coloured by an overlay; click a kernel for its
stages (that kernel and its neighbours) and edits, click an edge midpoint for its legal connections;
search by ONNX node or stage name. The whole stage-level graph is drawn only on request."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.graph_panel import show_edge, show_kernel
from app.state import redo, undo, update_state, widget_value
from app.ui import commit_state, current_model, current_plan, guarded
from app.views.dot import legend_dot, plan_to_dot
from app.views.fmt import fmt_bytes, fmt_us
from app.views.overview import (
    OVERLAYS,
    build_overview,
    neighbour_groups,
    overlay_values,
    overview_dot,
    overview_figure,
    pick_from_selection,
    search_stages,
)
from app.views.tables import group_rows

st.title("Tile-graph")

with guarded("Drawing the tile-graph"):
    state, loaded = current_model()
    result = current_plan(state, loaded)
    graph, plan = result.graph, result.plan
    st.caption(f"{state.model_name} · policy {plan.policy} (base {state.base_policy}) · {len(state.edits)} edit(s) · "
               f"{plan.kernels} kernels · {len(graph.stages)} stages · modeled "
               f"{fmt_us(plan.modeled_us) if plan.modeled_us else '—'} · DRAM "
               f"{fmt_bytes(plan.dram_bytes) if plan.dram_bytes else '—'} on {state.device}")
    measured, emulated, source = services.measured_numbers(state.model_hash, plan.plan_hash, state.device,
                                                           state.backend)
    tools = st.columns([2, 2, 1, 1, 1])
    overlay = tools[0].selectbox("Colour kernels by", list(OVERLAYS), key="tg_overlay",
                                 help="; ".join(f"{k}: {v[1]}" for k, v in OVERLAYS.items()))
    query = tools[1].text_input("Search ONNX node or stage", key="tg_search", placeholder="e.g. Softmax, node_Conv_12")
    fold = tools[2].toggle("Fold repeats", value=True, key="tg_fold",
                           help="consecutive kernels with the same canonical signature become one ×N node")
    if tools[3].button("Undo", disabled=not state.edits, key="tg_undo"):
        commit_state(undo(state))
        st.rerun()
    if tools[4].button("Redo", disabled=not state.redo, key="tg_redo"):
        commit_state(redo(state))
        st.rerun()

    with st.spinner("Laying out the kernels (Graphviz; once per plan)…"):
        overview = build_overview(graph, plan, fold_repeats=fold)
        positions = services.layout_positions(plan.plan_hash, fold, overview_dot(overview))
    values = overlay_values(plan, overlay, measured, emulated)
    if overlay != "modeled time" and not values:
        st.info(f"No {overlay} numbers for this plan yet: run it on the Kernels page "
                "(Compile + run for times, Verify on cuda-sim for emulated traffic).")

    chart_key = f"tg_overview_{plan.plan_hash}_{int(fold)}"
    group_at = {s: g.id for g in plan.groups for s in g.stages}

    def on_click() -> None:
        """A click in the overview (runs before the rerun): select that kernel or edge by stage names."""
        picked = pick_from_selection(fig, (widget_value(chart_key) or {}).get("selection"))
        if picked and picked[0] == "kernel":
            first = overview.node(picked[1]).groups[0]
            update_state(selection=("kernel", next(g for g in plan.groups if g.id == first).stages[0]))
        elif picked:
            update_state(selection=("edge", *overview.edges[picked[1]].stage_edges[0]))

    if query:
        hits = search_stages(graph, plan, query)
        if hits:
            pick_hit, go_hit = st.columns([4, 1])
            found = pick_hit.selectbox(f"{len(hits)} match(es)", range(len(hits)), key="tg_hit",
                                       format_func=lambda k: f"{hits[k][0]}  →  {hits[k][1]}")
            if go_hit.button("Select its kernel", key="tg_hit_go"):
                stage = hits[found][0].split("  (ONNX")[0]
                state = update_state(selection=("kernel", stage))
        else:
            st.warning(f"No stage or ONNX node matches '{query}'.")

    sel = state.selection
    node = edge_index = None
    if sel and sel[0] == "kernel" and sel[1] in group_at:
        node = overview.node_of_group(group_at[sel[1]])
    elif sel and sel[0] == "edge":
        edge_index = next((k for k, e in enumerate(overview.edges) if tuple(sel[1:]) in e.stage_edges), None)

    graph_col, side_col = st.columns([3, 2])
    with graph_col:
        fig = overview_figure(overview, positions, plan, overlay=overlay, values=values, measured_us=measured,
                              selected=node.key if node else None, selected_edge=edge_index)
        st.plotly_chart(fig, on_select=on_click, selection_mode="points", key=chart_key,
                                config={"scrollZoom": True, "displaylogo": False})
        st.caption(f"{len(overview.nodes)} node(s) for {plan.kernels} kernel(s), {len(overview.edges)} kernel edge(s). "
                   "Scroll to zoom, drag to pan, click a kernel or an edge's diamond. Colour: "
                   f"{overlay} in {OVERLAYS[overlay][0]}" + (f" (measured by the last {source})" if source else ""))
    with side_col:
        if node is not None:
            show_kernel(state, loaded, graph, plan, node, measured)
        elif edge_index is not None:
            show_edge(state, loaded, graph, plan, overview.edges[edge_index])
        else:
            st.info("Click a kernel (or search) to open its stages, reasons, tile, footprint and traffic; "
                    "click an edge's diamond to change its connection.")

    if node is not None:
        st.subheader(f"Stages of {node.name} and its neighbours")
        near = neighbour_groups(plan, node.groups[0])
        st.graphviz_chart(plan_to_dot(graph, plan, selected_group=node.groups[0], only_groups=near))
        st.graphviz_chart(legend_dot())

    with st.expander(f"Whole stage-level graph ({len(graph.stages)} stages)"):
        st.caption("Graphviz takes many seconds on a large model: drawn only on request.")
        if st.button("Draw all stages", key="tg_draw_all"):
            st.graphviz_chart(plan_to_dot(graph, plan, collapse_layers=len(graph.stages) > 150))
    st.subheader("Kernel groups")
    st.dataframe(pd.DataFrame(group_rows(plan)), hide_index=True, width="stretch")
