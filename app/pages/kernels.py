"""Kernels page: per-kernel table (stages, ONNX nodes, grid, block, shared bytes, traffic, modeled and
measured time, achieved bandwidth), the printed CUDA verified on the SIMT emulator (findings, bytes moved
beside the modeled traffic), generated CUDA and C source, rooflines per memory level."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.run_panel import bounded_controls, run_bounded, run_panel
from app.ui import current_model, current_plan, guarded
from app.views.kernels import SOURCE_LINES_SHOWN, clip_source, kernel_rows, kernel_sources
from app.views.roofline import LEVEL_BW, roofline_figure
from app.views.simt import (
    FINDING_COLUMNS,
    TRAFFIC_COLUMNS,
    simt_finding_rows,
    simt_traffic_rows,
    simt_verdict,
)
from engine.device import get_device

st.title("Kernels")

with guarded("Building the kernel table"):
    state, loaded = current_model()
    planned = current_plan(state, loaded)
    plan = planned.plan
    run = run_panel(state, planned, key="kernels_run")
    measured = run.kernel_us if run else None
    st.dataframe(pd.DataFrame(kernel_rows(planned.graph, plan, measured)), hide_index=True, width="stretch")

with guarded("Verifying on the SIMT emulator"):
    st.subheader("Verify on the SIMT emulator")
    st.caption("Runs the printed CUDA (the kernels of the CUDA tab below), unchanged, on the CPU with CUDA's "
               "execution model (backend cuda-sim: g++ builds it; every launch, barrier and shuffle emulated) and "
               "reports races, out-of-range and uninitialised accesses, partial barriers/shuffles and deadlocks "
               "with their source lines; outputs are checked against the reference executor. The bytes are "
               "emulated counts of the printed CUDA's global and shared accesses (requests, before any cache), "
               "beside the plan's modeled traffic. The emulator measures no time: the GPU times elsewhere on this "
               "page remain modeled (measured only by Compile + run on CUDA).")
    sim_args = (planned.graph, plan, state.model_hash, plan.plan_hash, state.device, state.model_path)
    clicked, limit, cancelled = bounded_controls("kernels_simt", "Verify on the SIMT emulator")
    sim = run_bounded("kernels_simt", f"Building the printed CUDA of {plan.kernels} kernel(s) with g++ and "
                      "emulating every launch…", lambda **kw: services.verify_simt(*sim_args, **kw), limit,
                      clicked=clicked, cancelled=cancelled)
    if sim is not None:
        st.caption(f"Emulated in {sim.seconds:.2f} s and checked against the reference executor.")
    else:
        sim = services.cached_simt(state.model_hash, plan.plan_hash, state.device)
    if sim is not None:
        ok, text = simt_verdict(sim, services.MATCH_TOLERANCE)
        (st.success if ok else st.error)(text)
        st.markdown("**Findings**: the line is in the kernel's own unit, `KERNEL.cu` as `tileweave compile "
                    "--target cuda` writes it (the CUDA tab shows the whole program, so its numbers differ); "
                    "`source` quotes the line")
        st.dataframe(pd.DataFrame(simt_finding_rows(sim), columns=list(FINDING_COLUMNS)), hide_index=True,
                     width="stretch")
        st.markdown("**Bytes moved (emulated) vs modeled**, per kernel, all its launches")
        st.dataframe(pd.DataFrame(simt_traffic_rows(sim), columns=list(TRAFFIC_COLUMNS)), hide_index=True,
                     width="stretch")

with guarded("Showing generated source"):
    st.subheader("Generated source")
    with st.spinner(f"Generating the CUDA and C of {plan.kernels} kernels (once per plan)…"):
        sources = services.kernel_sources(planned.graph, plan, state.model_hash, plan.plan_hash, state.device)
    names = [g.name for g in plan.groups]
    pick, whole_col = st.columns([3, 1], vertical_alignment="bottom")
    shown = pick.selectbox("Kernel", names, key="kernels_source_pick",
                           help="one kernel's code at a time; the downloads hold the whole program")
    whole = whole_col.toggle("Whole kernel", key="kernels_source_whole",
                             help=f"otherwise its first {SOURCE_LINES_SHOWN} lines (a long code block takes the "
                                  "browser seconds to draw)")
    cuda_tab, c_tab = st.tabs(["CUDA C", "C (CPU backend)"])
    for tab, lang, ext in ((cuda_tab, "cuda", "cu"), (c_tab, "c", "c")):
        code = kernel_sources(sources[lang]).get(shown, sources[lang])
        text, hidden = (code, 0) if whole else clip_source(code)
        tab.code(text, language=lang)
        if hidden:
            tab.caption(f"{hidden:,} more lines: switch on 'Whole kernel', or download the whole program")
        tab.download_button(f"Download the whole program (.{ext})", sources[lang], key=f"kernels_src_{lang}",
                            file_name=f"{state.model_name}_{plan.policy}.{ext}", mime="text/plain")

with guarded("Drawing the rooflines"):
    st.subheader("Roofline per memory level")
    device = get_device(state.device)
    for col, level in zip(st.columns(len(LEVEL_BW)), LEVEL_BW):
        col.plotly_chart(roofline_figure(plan, device, level, measured), key=f"roof_{level}")
