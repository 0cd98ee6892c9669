"""Tuning page: a measured tune job for the loaded model on this CPU with a progress bar, every tile
candidate's measured time, and the tuning database's hits and contents."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from app import services
from app.run_panel import bounded_controls, run_bounded
from app.ui import current_model, guarded
from app.views.tuning import candidate_rows, headline
from engine.schedule.tune import MAX_TUNE

st.title("Tuning")
st.caption("Each kernel's top-K tile candidates (for welder also the other policies' kernels) are compiled and "
           "timed on this CPU through the C backend; the fastest is kept. Measurements go to the tuning "
           "database, so a second run is served from it. `tileweave tune` runs the same job on Ray workers "
           "or a cluster (docs/scale-out.md). Cancel, or the time limit, stops a job after the task in flight; "
           "what it measured stays in the database.")

with guarded("Tuning"):
    state, loaded = current_model()
    policies = services.policies()
    left, mid = st.columns(2, vertical_alignment="bottom")
    policy = left.selectbox("Policy", policies, index=policies.index(state.base_policy)
                            if state.base_policy in policies else 0, key="tune_policy")
    k = int(mid.number_input("Candidates per kernel (K)", min_value=1, max_value=MAX_TUNE, value=2, step=1,
                             key="tune_k"))
    clicked, limit, cancelled = bounded_controls(
        "tune_run", "Run tune job", limit_label="Time limit for the job (s)", default=services.TUNE_TIME_LIMIT_S,
        limit_help="checked after each measured task: a job past it stops there and says so")

    def tune(time_limit: float, poll) -> None:
        bar = st.progress(0.0, text="planning…")
        start = time.perf_counter()

        def progress(done: int, total: int, hits: int) -> None:
            poll(time.perf_counter() - start)
            bar.progress(done / total if total else 1.0, text=f"{done}/{total} tasks measured, {hits} db hits")

        return services.tune_model(state.model_path, state.model_hash, policy, k, progress=progress,
                                   time_limit=time_limit)

    run_bounded("tune_run", f"Tuning {state.model_name} ({policy}, K={k}) on this CPU…", tune, limit,
                clicked=clicked, cancelled=cancelled)
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
