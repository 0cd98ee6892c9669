"""Partition page: the current plan split across N devices over a link (Wolong), modeled: per-device
stages and memory peaks, the kernels by device, the transfer table and the multi-device timeline."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.ui import current_model, current_plan, guarded
from app.views.partition import kernel_rows, partition_figure, stage_rows, transfer_rows
from engine.partition.links import DEFAULT_LINK, LINKS

st.title("Partition")

with guarded("Partitioning the plan"):
    state, loaded = current_model()
    planned = current_plan(state, loaded)
    left, right = st.columns(2)
    devices = int(left.number_input("Devices", min_value=1, max_value=8, value=2, key="partition_devices"))
    names = list(LINKS)
    link = right.selectbox("Link", names, index=names.index(DEFAULT_LINK), key="partition_link",
                           format_func=lambda n: f"{n}: {LINKS[n].description}")
    with st.spinner(f"Partitioning {planned.plan.kernels} kernels over {devices} devices (once per plan)…"):
        _, _, part = services.partition_for(planned.graph, planned.plan, state.model_hash, planned.plan.plan_hash,
                                            state.device, devices, link)
    a, b, c = st.columns(3)
    a.metric("Makespan (one request)", f"{part.makespan_us:.1f} µs")
    b.metric("One device", f"{part.single_device_us:.1f} µs",
             "fits" if part.single_device_fits else "does not fit its memory", delta_color="off")
    c.metric("Period (a stream)", f"{part.period_us:.1f} µs")
    lk = LINKS[link]
    st.caption(f"Modeled for {devices} × {state.device} ({part.budget_bytes:,} B each); {lk.name}: "
               f"{lk.bandwidth_bytes_per_s / 1e9:g} GB/s ({lk.source['bandwidth_bytes_per_s']}), "
               f"{lk.latency_s * 1e6:g} µs ({lk.source['latency_s']}). Tensor parallel: "
               f"{', '.join(part.tensor_parallel) or 'none'}. Run it on Ray actors with "
               f"`tileweave run MODEL --backend cpu --devices {devices}`.")
    st.plotly_chart(partition_figure(part), key="partition_chart")
    st.subheader("Devices")
    st.dataframe(pd.DataFrame(stage_rows(part)), hide_index=True)
    st.subheader("Kernels by device")
    st.dataframe(pd.DataFrame(kernel_rows(part)), hide_index=True)
    st.subheader(f"Transfers ({len(part.transfers)}, {part.transfer_bytes:,} B)")
    st.dataframe(pd.DataFrame(transfer_rows(part), columns=["tensor", "from", "to", "bytes", "µs", "start µs"]),
                 hide_index=True)
    for d in part.decisions:
        st.text(d)
    st.download_button("Download Chrome trace (open in Perfetto)", services.partition_trace_text(part),
                       file_name=f"{state.model_name}_partition_trace.json", mime="application/json",
                       key="partition_trace")
