"""Plan page: base policy and (welder) operator batching; edit an edge's connection, split or merge
groups, set tiles/threads; each edit validated (a refused one shows the rule it breaks); ordered edit
list with undo/redo; the plan's decision log (batching first); load and save plan JSON."""

from __future__ import annotations

import dataclasses

import pandas as pd
import streamlit as st

from app import services
from app.state import clear_edits, redo, undo
from app.ui import commit_state, current_model, current_plan, guarded, submit_edits
from app.views.layers import matching_edges
from app.views.tables import decision_rows, describe_edit, edge_label
from engine.schedule.plan import Edit

st.title("Plan")

with guarded("Loading the plan"):
    state, loaded = current_model()
    policies = services.policies()
    pick_policy, pick_batching = st.columns([3, 2])
    policy = pick_policy.selectbox("Base policy", policies, key="plan_policy",
                                   index=policies.index(state.base_policy) if state.base_policy in policies else 0)
    batching = pick_batching.toggle(
        "Operator batching", value=state.batching, key="plan_batching",
        disabled=not services.batching_applies(policy),
        help="welder: contractions computing the same expression of the same input (Q/K/V projections, "
             "LSTM gate GEMMs) run as one batched contraction; edits name the stages of the graph this gives")
    if (policy, batching) != (state.base_policy, state.batching):
        state = commit_state(dataclasses.replace(state, base_policy=policy, batching=batching))
    result = current_plan(state, loaded)
    graph, plan = result.graph, result.plan
    batched = sum(1 for r in decision_rows(plan) if r["kind"] == "batching" and "batched into" in r["decision"])
    st.caption(f"{plan.kernels} kernels · {len(state.edits)} edit(s) on {state.base_policy} · device {state.device}"
               + (f" · {batched} batched contraction set(s)" if services.plan_batching(plan) else ""))
    for index, reason in result.refused:
        st.warning(f"Edit {index + 1} ({describe_edit(state.edits[index])}) no longer applies: {reason}")


def submit(edits: list[Edit]) -> None:
    submit_edits(state, loaded, edits)


with guarded("Editing the plan"):
    edge_tab, group_tab, tile_tab = st.tabs(["Edge connection", "Split / merge", "Tiles and threads"])
    with edge_tab, st.form("edge_form"):
        labels = {edge_label(e.producer, e.consumer): e for e in plan.edges}
        pick = st.selectbox("Edge", list(labels), key="plan_edge",
                            format_func=lambda k: f"{k}  [{labels[k].conn.value}]")
        conn = st.selectbox("Connection", services.conn_choices(), key="plan_conn")
        all_layers = st.checkbox("Apply to all identical layers", key="plan_all_layers")
        if st.form_submit_button("Apply edge edit"):
            e = labels[pick]
            pairs = matching_edges(graph, e.producer, e.consumer) if all_layers else [e.key]
            submit([Edit.make("set_edge", producer=p, consumer=c, conn=conn) for p, c in pairs])
    with group_tab:
        fused = [edge_label(e.producer, e.consumer) for e in plan.edges if e.conn.fused]
        kernel = [edge_label(e.producer, e.consumer) for e in plan.edges if not e.conn.fused]
        left, right = st.columns(2)
        with left.form("split_form"):
            split = st.selectbox("Split the group at a fused edge", fused or ["—"], key="plan_split")
            if st.form_submit_button("Split", disabled=not fused):
                p, c = split.split(" → ")
                submit([Edit.make("split", producer=p, consumer=c)])
        with right.form("merge_form"):
            merge = st.selectbox("Merge the groups joined by a kernel edge", kernel or ["—"], key="plan_merge")
            if st.form_submit_button("Merge", disabled=not kernel):
                p, c = merge.split(" → ")
                submit([Edit.make("merge", producer=p, consumer=c)])
    with tile_tab:
        rows = pd.DataFrame([{"group": g.id, "kernel": g.name, "anchor stage": g.segments[0].stage,
                              "tile": "x".join(map(str, g.segments[0].shape)), "threads": g.segments[0].threads,
                              "k step": "x".join(map(str, g.segments[0].reduce_step)),
                              "threads ty x tx": "x".join(map(str, g.segments[0].thread_shape))}
                             for g in plan.groups])
        edited = st.data_editor(rows, key="plan_tiles", hide_index=True, width="stretch",
                                disabled=["group", "kernel", "anchor stage"])
        if st.button("Apply tile changes", key="plan_apply_tiles"):
            edits = []
            for before, after in zip(rows.to_dict("records"), edited.to_dict("records")):
                keys = ("tile", "threads", "k step", "threads ty x tx")
                if any(before[k] != after[k] for k in keys):
                    try:
                        shape = [int(x) for x in str(after["tile"]).lower().replace("×", "x").split("x")]
                        step = [int(x) for x in str(after["k step"] or "").lower().replace("×", "x").split("x") if x.strip()]
                        # a mapping left as it was goes with its tile only: a new tile takes its own default
                        mapping = [int(x) for x in str(after["threads ty x tx"] or "").lower().replace("×", "x").split("x")
                                   if x.strip()] if after["threads ty x tx"] != before["threads ty x tx"] or all(
                                       before[k] == after[k] for k in keys[:3]) else []
                    except ValueError:
                        st.error(f"Refused: tile '{after['tile']}' / k step '{after['k step']}' / threads "
                                 f"'{after['threads ty x tx']}' of {after['kernel']} is not like 32x64 / 32 / 16x16")
                        break
                    edits.append(Edit.make("set_tile", stage=before["anchor stage"], shape=shape,
                                           threads=int(after["threads"]), **({"reduce_step": step} if step else {}),
                                           **({"thread_shape": mapping} if mapping else {})))
            else:
                if edits:
                    submit(edits)
                else:
                    st.info("No tile or thread count changed.")

with guarded("Showing the edits"):
    st.subheader("Edits (replayed in order on the base policy)")
    st.dataframe(pd.DataFrame([{"#": k + 1, "edit": describe_edit(e)} for k, e in enumerate(state.edits)],
                              columns=["#", "edit"]), hide_index=True, width="stretch")
    b1, b2, b3 = st.columns(3)
    if b1.button("Undo", disabled=not state.edits, key="plan_undo"):
        commit_state(undo(state))
        st.rerun()
    if b2.button("Redo", disabled=not state.redo, key="plan_redo"):
        commit_state(redo(state))
        st.rerun()
    if b3.button("Clear all edits", disabled=not state.edits, key="plan_clear"):
        commit_state(clear_edits(state))
        st.rerun()

with guarded("Showing the decisions"):
    rows = decision_rows(plan)
    st.subheader("Decisions")
    st.caption("Why each choice was made, in order: operator batching first, then the policy's edges and groups.")
    st.dataframe(pd.DataFrame(rows, columns=["#", "kind", "decision"]), hide_index=True, width="stretch",
                 key="plan_decisions")

with guarded("Saving or loading a plan"):
    st.subheader("Plan JSON")
    st.download_button("Save plan JSON", services.plan_json_text(plan), key="plan_save",
                       file_name=f"{state.model_name}_{plan.policy}_plan.json", mime="application/json")
    upload = st.file_uploader("Load plan JSON or a kernel bundle .zip (base policy + edits are replayed)",
                              type=["json", "zip"], key="plan_load")
    if upload is not None and st.button("Load this plan", key="plan_load_apply"):
        with st.spinner(f"Replaying {upload.name} on {state.model_name}…"):
            _, loaded_plan = services.read_plan_json(upload.getvalue(), loaded.graph)
        base = loaded_plan.base_policy or loaded_plan.policy
        if base not in policies:
            raise services.AppError(f"the plan's base policy '{base}' is unknown", hint=f"use one of {policies}")
        commit_state(dataclasses.replace(state, base_policy=base, edits=loaded_plan.edits, redo=(),
                                         batching=services.plan_batching(loaded_plan)
                                         if services.batching_applies(base) else state.batching))
        st.rerun()
