"""Export page: the kernel bundle, the plan JSON, the rProgram trace JSON (measured durations when the
plan was run on its device) and the model as annotated ONNX (our decisions in each node's metadata)."""

from __future__ import annotations

import json

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

with guarded("Exporting the annotated model"):
    ran = services.cached_run(planned.graph, plan, state.model_hash, plan.plan_hash, state.device, state.backend,
                              state.model_path)
    ran_us = dict(ran.kernel_us) if ran else None
    # Made here, in the page's run (cached per plan and measurement): a deferred callable runs outside the
    # script's thread, and in the browser tests its download sometimes never came (the button stayed disabled).
    with st.spinner("Annotating the model (once per plan)…"):
        annotated = services.annotated_onnx_bytes(state.model_path, state.model_hash, plan.plan_hash,
                                                  json.dumps(ran_us, sort_keys=True), planned.graph, plan, ran_us)
    st.download_button("Export annotated ONNX", annotated,
                       file_name=f"{stem}_annotated.onnx", mime="application/octet-stream", key="export_onnx",
                       help="the model with tileweave.kernel, .connection, .kernel_modeled_us (and "
                            ".kernel_measured_us after a run) in each node's metadata: open it in Netron or "
                            "Model Explorer (engine.api.annotate_onnx; CLI: tileweave export --annotated-onnx)")

with guarded("Exporting the trace"):
    measured = services.timeline_measured(state.model_hash, plan.plan_hash, state.device, state.backend)
    with st.spinner("Building the rProgram (once per plan)…"):
        rp = services.rprogram_for(plan, state.model_hash, plan.plan_hash, state.device, measured,
                                   json.dumps(measured, sort_keys=True) if measured else "")
    st.caption("Trace durations: " + ("measured by the last run" if measured else "modeled (not run on this device)"))
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
