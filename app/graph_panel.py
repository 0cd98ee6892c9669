"""The Tile-graph page's side panel: what is selected in the overview (a kernel or an edge between
kernels) with its reasons, tile, footprint and traffic, and the edits it offers — an edge's legal
connections (illegal ones disabled with the rule they break), split/merge, tile and threads — all
through the same validated edit path and undo stack as the Plan page."""

from __future__ import annotations

import streamlit as st

from app import services
from app.state import AppState, update_state
from app.ui import submit_edits
from app.views.fmt import fmt_us
from app.views.layers import matching_edges
from app.views.overview import KernelEdge, KernelNode
from app.views.tables import edge_detail, edge_label, group_detail
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Edit, Plan


def connection_buttons(state: AppState, loaded: services.LoadedModel, graph: PrimGraph, plan: Plan,
                       producer: str, consumer: str, key: str) -> None:
    """One button per connection level of the edge: legal ones apply it, illegal ones are disabled
    and say which rule they break."""
    current = plan.edge(producer, consumer).conn.value
    with st.spinner("Trying each connection level of this edge through the validated edit path…"):
        choices = services.legal_connections(loaded.graph, state.model_hash, state.base_policy, state.device,
                                             state.edits, state.batching, producer, consumer)
    all_layers = st.checkbox("Apply to all identical layers", key=f"{key}_layers")
    for conn, rule in choices:
        label = f"{conn} (current)" if conn == current else f"set {conn}"
        if st.button(label, key=f"{key}_{conn}", disabled=bool(rule) or conn == current,
                     help=rule or f"connect {edge_label(producer, consumer)} at {conn}"):
            pairs = matching_edges(graph, producer, consumer) if all_layers else [(producer, consumer)]
            submit_edits(state, loaded, [Edit.make("set_edge", producer=p, consumer=c, conn=conn) for p, c in pairs])
        if rule:
            st.caption(f":grey[{conn}: {rule}]")


def show_edge(state: AppState, loaded: services.LoadedModel, graph: PrimGraph, plan: Plan, edge: KernelEdge) -> None:
    st.subheader("Edge between kernels")
    pairs = list(edge.stage_edges)
    labels = [edge_label(p, c) for p, c in pairs]
    chosen = state.selection[1:] if state.selection[1:] in pairs else pairs[0]
    pick = st.selectbox(f"Tensor edge ({len(pairs)})", labels, index=pairs.index(chosen), key="tg_edge_pick")
    producer, consumer = pairs[labels.index(pick)]
    if (producer, consumer) != chosen:
        update_state(selection=("edge", producer, consumer))
    st.json(edge_detail(graph, plan, producer, consumer), expanded=False)
    st.caption("Connect this edge at another level (merges the two kernels when fused):")
    connection_buttons(state, loaded, graph, plan, producer, consumer, "tg_conn")


def show_kernel(state: AppState, loaded: services.LoadedModel, graph: PrimGraph, plan: Plan, node: KernelNode,
                measured: dict[str, float]) -> None:
    group = next(g for g in plan.groups if g.id == node.groups[0])
    st.subheader(group.name + (f" ×{node.repeat}" if node.repeat > 1 else ""))
    modeled = group.cost.modeled_us if group.cost else None
    ran = measured.get(group.name, group.measured_us)
    st.caption(f"{len(group.stages)} stage(s) · {node.conns} · modeled {fmt_us(modeled)} · "
               f"measured {fmt_us(ran) if ran is not None else 'not run'}"
               + (f" · stands for {node.repeat} identical kernels" if node.repeat > 1 else ""))
    st.json(group_detail(graph, group), expanded=False)
    members = set(group.stages)
    inner = [e for e in plan.edges if e.producer in members and e.consumer in members]
    split_tab, merge_tab, tile_tab = st.tabs(["Edges / split", "Merge", "Tile and threads"])
    with split_tab:
        if not inner:
            st.caption("A single stage: nothing to split.")
        else:
            labels = [f"{edge_label(e.producer, e.consumer)}  [{e.conn.value}]" for e in inner]
            pick = inner[labels.index(st.selectbox("Internal edge", labels, key="tg_inner"))]
            if st.button("Split the kernel here", key="tg_split"):
                submit_edits(state, loaded, [Edit.make("split", producer=pick.producer, consumer=pick.consumer)])
            connection_buttons(state, loaded, graph, plan, pick.producer, pick.consumer, "tg_inner_conn")
    with merge_tab:
        outer = [e for e in plan.edges if (e.producer in members) != (e.consumer in members)]
        if not outer:
            st.caption("No edge to another kernel.")
        else:
            labels = [edge_label(e.producer, e.consumer) for e in outer]
            pick = outer[labels.index(st.selectbox("Merge with the kernel across", labels, key="tg_merge_pick"))]
            if st.button("Merge", key="tg_merge"):
                submit_edits(state, loaded, [Edit.make("merge", producer=pick.producer, consumer=pick.consumer)])
    with tile_tab, st.form("tg_tile_form"):
        seg = group.segments[0]
        tile = st.text_input("Tile of the anchor stage", "x".join(map(str, seg.shape)), key="tg_tile",
                             help=f"anchor stage {seg.stage}; like 32x64")
        threads = st.number_input("Threads", min_value=1, max_value=1024, value=int(seg.threads), key="tg_threads")
        kstep = st.text_input("k step", "x".join(map(str, seg.reduce_step)), key="tg_kstep",
                              help="a contraction's reduce step per reduce axis, like 32 (empty: the default)")
        was = "x".join(map(str, seg.thread_shape))
        tmap = st.text_input("Threads over the GEMM tile (ty x tx)", was, key="tg_tmap",
                             help="thread rows x thread columns of a GEMM segment, like 16x16 (empty: the default; "
                                  "a new tile or thread count takes its own default unless you change this too)")
        if st.form_submit_button("Apply tile"):
            try:
                shape = [int(x) for x in tile.lower().replace("×", "x").split("x")]
                step = [int(x) for x in kstep.lower().replace("×", "x").split("x") if x.strip()]
                same = (shape, int(threads)) == (list(seg.shape), seg.threads)
                mapping = [int(x) for x in tmap.lower().replace("×", "x").split("x") if x.strip()] \
                    if tmap != was or same else []
            except ValueError:
                st.error(f"Refused: tile '{tile}' / k step '{kstep}' / threads '{tmap}' is not like 32x64 / 32 / 16x16")
            else:
                submit_edits(state, loaded, [Edit.make("set_tile", stage=seg.stage, shape=shape, threads=int(threads),
                                                       **({"reduce_step": step} if step else {}),
                                                       **({"thread_shape": mapping} if mapping else {}))])
