"""Kernels page: per-kernel table (stages, ONNX nodes, grid, block, shared bytes, traffic, modeled and
measured time, achieved bandwidth), generated CUDA and C source, rooflines per memory level."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.run_panel import run_panel
from app.ui import current_model, current_plan, guarded
from app.views.kernels import kernel_rows
from app.views.roofline import LEVEL_BW, roofline_figure
from engine.device import get_device

st.title("Kernels")

with guarded("Building the kernel table"):
    state, loaded = current_model()
    planned = current_plan(state, loaded)
    plan = planned.plan
    run = run_panel(state, planned, key="kernels_run")
    measured = run.kernel_us if run else None
    st.dataframe(pd.DataFrame(kernel_rows(planned.graph, plan, measured)), hide_index=True, width="stretch")

with guarded("Showing generated source"):
    st.subheader("Generated source")
    sources = services.kernel_sources(planned.graph, plan, state.model_hash, plan.plan_hash, state.device)
    cuda_tab, c_tab = st.tabs(["CUDA C", "C (CPU backend)"])
    cuda_tab.code(sources["cuda"], language="cuda")
    c_tab.code(sources["c"], language="c")

with guarded("Drawing the rooflines"):
    st.subheader("Roofline per memory level")
    device = get_device(state.device)
    for col, level in zip(st.columns(len(LEVEL_BW)), LEVEL_BW):
        col.plotly_chart(roofline_figure(plan, device, level, measured), key=f"roof_{level}")
