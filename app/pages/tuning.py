"""Tuning page: a measured tune job for the loaded model on this CPU with a progress bar, every tile
candidate's measured time, and the tuning database's hits and contents."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.ui import current_model, guarded
from app.views.tuning import candidate_rows, headline
from engine.schedule.tune import MAX_TUNE

st.title("Tuning")
st.caption("Each kernel's top-K tile candidates (for welder also the other policies' kernels) are compiled and "
           "timed on this CPU through the C backend; the fastest is kept. Measurements go to the tuning "
           "database, so a second run is served from it. `tileweave tune` runs the same job on Ray workers "
           "or a cluster (docs/scale-out.md).")

with guarded("Tuning"):
    state, loaded = current_model()
    policies = services.policies()
    left, mid, right = st.columns([2, 2, 1], vertical_alignment="bottom")
    policy = left.selectbox("Policy", policies, index=policies.index(state.base_policy)
                            if state.base_policy in policies else 0, key="tune_policy")
    k = int(mid.number_input("Candidates per kernel (K)", min_value=1, max_value=MAX_TUNE, value=2, step=1,
                             key="tune_k"))
    if right.button("Run tune job", key="tune_run", type="primary"):
        bar = st.progress(0.0, text="planning…")

        def progress(done: int, total: int, hits: int) -> None:
            bar.progress(done / total if total else 1.0, text=f"{done}/{total} tasks measured, {hits} db hits")

        services.tune_model(state.model_path, state.model_hash, policy, k, progress=progress)
    report = services.last_tune(state.model_hash, policy, k)
    if report is None:
        st.info(f"Run a tune job to measure {state.model_name}'s kernels on this CPU.")
    else:
        for column, (label, value) in zip(st.columns(5), headline(report.rows[0], report.tasks, report.hits,
                                                                    report.seconds)):
            column.metric(label, value)
        st.subheader("Candidates")
        st.dataframe(pd.DataFrame(candidate_rows(report.jobs[0].candidates())), hide_index=True, width="stretch",
                     key="tune_candidates")
        st.caption("Decisions: " + " · ".join(d for d in report.plans[0].decisions if d.startswith("tune:")))
    path, summary = services.tune_db_summary()
    st.subheader("Tuning database")
    st.caption(f"{path}: rows per device and code version (a row is one kernel timed by one task)")
    st.dataframe(pd.DataFrame(summary, columns=["device", "device_hash", "code_version", "rows", "signatures",
                                                "last"]), hide_index=True, width="stretch", key="tune_db")
