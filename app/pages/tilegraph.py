"""Tile-graph page: the primitive graph with kernel groups as clusters and edges coloured by
connection; select a group or edge for its reasons, tile, footprint and traffic; SVG download."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.ui import current_model, current_plan, guarded
from app.views.dot import legend_dot, plan_to_dot
from app.views.fmt import fmt_bytes, fmt_us
from app.views.layers import repeated_layers
from app.views.tables import edge_detail, edge_label, group_detail, group_rows

st.title("Tile-graph")

with guarded("Drawing the tile-graph"):
    state, loaded = current_model()
    result = current_plan(state, loaded)
    graph, plan = result.graph, result.plan
    st.caption(f"{state.model_name} · policy {plan.policy} (base {state.base_policy}) · {len(state.edits)} edit(s) · "
               f"{plan.kernels} kernels · modeled {fmt_us(plan.modeled_us) if plan.modeled_us else '—'} · "
               f"DRAM {fmt_bytes(plan.dram_bytes) if plan.dram_bytes else '—'} on {state.device}")

    groups = {f"{g.id}: {g.name}": g for g in plan.groups}
    edges = {edge_label(e.producer, e.consumer): e for e in plan.edges}
    pick_group, pick_edge, pick_collapse = st.columns([2, 3, 1])
    group_key = pick_group.selectbox("Group", ["—", *groups], key="tg_group")
    edge_key = pick_edge.selectbox("Edge", ["—", *edges], key="tg_edge")
    repeats = repeated_layers(graph)
    collapse = pick_collapse.checkbox("Collapse repeated layers", value=len(graph.stages) > 150,
                                      disabled=not repeats, key="tg_collapse",
                                      help=f"{sum(len(v) for v in repeats.values())} layer(s) repeat an earlier one")
    group = groups.get(group_key)
    edge = edges.get(edge_key)
    dot = plan_to_dot(graph, plan, selected_group=group.id if group else None,
                      selected_edge=edge.key if edge else None, collapse_layers=collapse)

    graph_col, detail_col = st.columns([3, 2])
    with graph_col:
        st.graphviz_chart(dot)  # natural size: stretching blows small graphs up
        st.caption("Legend")
        st.graphviz_chart(legend_dot())
        # Rendering a large uncollapsed graph takes Graphviz many seconds: only on request.
        if st.button("Render SVG for download", key="tg_render_svg"):
            with guarded("Rendering SVG"):
                svg = services.dot_to_svg(dot)
                st.download_button("Download SVG", svg, file_name=f"{state.model_name}_{plan.policy}.svg",
                                   mime="image/svg+xml", key="tg_svg")
    with detail_col:
        if group:
            st.subheader(group.name)
            st.json(group_detail(graph, group), expanded=True)
        if edge:
            st.subheader("Edge")
            st.json(edge_detail(graph, plan, edge.producer, edge.consumer), expanded=True)
        if not group and not edge:
            st.info("Select a group or an edge to see its reasons, tile, footprint and traffic.")
    st.subheader("Kernel groups")
    st.dataframe(pd.DataFrame(group_rows(plan)), hide_index=True, width="stretch")
