"""Compare page: two plans of the model side by side (policies, the edited plan, or a saved plan
JSON): headline numbers, per-group differences, Markdown export."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.ui import current_model, current_plan, guarded
from app.views.diff import diff_plans, diff_to_markdown

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
            return choice, current_plan(state, loaded).plan
        if choice == SAVED:
            upload = column.file_uploader(f"Plan JSON or bundle .zip for {label}", type=["json", "zip"],
                                          key=f"cmp_file_{label}")
            if upload is None:
                return choice, None
            return upload.name, services.read_plan_json(upload.getvalue(), graph)[1]
        return choice, services.build_plan(graph, state.model_hash, choice, state.device, "[]", state.batching).plan

    left, right = st.columns(2)
    a_label, a = pick(left, "A", 0)
    b_label, b = pick(right, "B", 1 if len(options) > 2 else 0)
    if a is None or b is None:
        st.info("Upload the saved plan JSON to compare it.")
        st.stop()
    runs = [services.cached_run(graph, p, state.model_hash, p.plan_hash, state.device, state.backend,
                                state.model_path) for p in (a, b)]
    diff = diff_plans(a, b, a_label, b_label, tuple(r.total_us if r else None for r in runs))
    st.dataframe(pd.DataFrame(diff.headline, columns=["metric", a_label, b_label]), hide_index=True,
                 width="stretch")
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
