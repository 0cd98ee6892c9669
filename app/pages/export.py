"""Export page: the kernel bundle, the plan JSON and the rProgram trace JSON of the current plan."""

from __future__ import annotations

import streamlit as st

from app import services
from app.ui import current_model, current_plan, guarded

st.title("Export")

with guarded("Preparing the exports"):
    state, loaded = current_model()
    planned = current_plan(state, loaded)
    plan = planned.plan
    stem = f"{state.model_name}_{plan.policy}"
    st.caption(f"{state.model_name} · {plan.policy} · {len(state.edits)} edit(s) · plan hash {plan.plan_hash}")
    st.download_button("Plan JSON", services.plan_json_text(plan), file_name=f"{stem}_plan.json",
                       mime="application/json", key="export_plan")

with guarded("Exporting the trace"):
    rp = services.rprogram_for(plan, state.model_hash, plan.plan_hash, state.device, None, "")
    st.download_button("Trace JSON (Chrome / Perfetto)", services.trace_json_text(rp),
                       file_name=f"{stem}_trace.json", mime="application/json", key="export_trace")

with guarded("Building the kernel bundle"):
    # NVRTC compiles every kernel for two archs: only when the button is clicked (deferred data).
    st.download_button("Kernel bundle (.zip)",
                       lambda: services.bundle_bytes(planned.graph, plan, state.model_hash, plan.plan_hash,
                                                     state.device),
                       file_name=f"{stem}_bundle.zip", mime="application/zip", key="export_bundle",
                       help="CUDA + PTX/CUBIN for sm_80 and sm_90, C, program/plan/trace JSON, weights, "
                            "a standalone runner (run_bundle.py: CPU or GPU) and a hashed manifest "
                            "(engine.bundle.export_bundle)")
