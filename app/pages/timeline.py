"""Timeline page: the rProgram as vEU × time, sequential vs rProgram makespan, Chrome trace download."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from app import services
from app.run_panel import run_panel
from app.ui import current_model, current_plan, guarded
from app.views.timeline import makespan_rows, timeline_figure

st.title("Timeline")

with guarded("Scheduling the rProgram"):
    state, loaded = current_model()
    planned = current_plan(state, loaded)
    plan = planned.plan
    run = run_panel(state, planned, key="timeline_run")
    measured = services.timeline_measured(state.model_hash, plan.plan_hash, state.device, state.backend) if run else None
    key = json.dumps(measured, sort_keys=True) if measured else ""
    with st.spinner("Building the rProgram (once per plan)…"):
        rp = services.rprogram_for(plan, state.model_hash, plan.plan_hash, state.device, measured, key)
    left, mid, right = st.columns(3)
    left.metric("Sequential kernels", f"{rp.sequential_us:.1f} µs")
    mid.metric("rProgram makespan", f"{rp.makespan_us:.1f} µs", f"{rp.speedup:.2f}× faster")
    right.metric("vEU utilisation", f"{rp.utilization:.0%}")
    st.caption("Durations are " + (f"measured ({state.backend} run on {state.device})" if measured else
                                   f"modeled for {state.device} (cost model; CPU-backend times are GPU times only "
                                   "for a plan made for the host device)"))
    st.plotly_chart(timeline_figure(rp), key="timeline_chart")
    st.dataframe(pd.DataFrame(makespan_rows(rp)), hide_index=True)
    st.download_button("Download Chrome trace (open in Perfetto)", services.trace_json_text(rp),
                       file_name=f"{state.model_name}_{plan.policy}_trace.json", mime="application/json",
                       key="timeline_trace")
