"""Model page: pick a bundled sample or upload an ONNX file; summary; device and backend."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import services
from app.state import update_state
from app.ui import current_model, guarded, load_into_state
from app.views.tables import model_summary, stage_op_rows, summary_cards

st.title("Model")
entries = services.catalog()
names = [e["name"] for e in entries]

with guarded("Loading the model"):
    state, _ = current_model()
    # An uploaded model stays current when the user comes back to this page (the radio's own state is
    # gone after visiting another page: default it from the model, never to a sample that replaces it).
    uploaded = bool(state.model_path) and state.model_name not in names
    source = st.radio("Source", ["Bundled sample", "Upload .onnx"], horizontal=True, key="model_source",
                      index=1 if uploaded else 0)
    if source == "Bundled sample":
        index = names.index(state.model_name) if state.model_name in names else 0
        name = st.selectbox("Sample", names, index=index, key="sample",
                            format_func=lambda n: f"{n} — {next(e for e in entries if e['name'] == n)['category']}")
        st.caption(next(e for e in entries if e["name"] == name)["description"])
        if name != state.model_name:
            with st.spinner(f"Importing {name}…"):
                state = load_into_state(name, str(services.sample_path(name)))
    else:
        upload = st.file_uploader(f"ONNX model (at most {services.UPLOAD_LIMIT_MB} MiB)", type=["onnx"],
                                  key="upload")
        if upload is None and uploaded:
            st.caption(f"Current model: {state.model_name} (uploaded earlier)")
        if upload is not None:
            path = services.save_upload(upload.name, upload.getvalue())
            if str(path) != state.model_path:
                with st.spinner(f"Importing {upload.name}…"):
                    state = load_into_state(upload.name, str(path))

with guarded("Summarising the model"):
    state, loaded = current_model()
    st.subheader(f"{state.model_name}  ·  hash {state.model_hash}")
    summary = model_summary(loaded.graph, loaded.onnx_ops)
    for col, (label, value) in zip(st.columns(len(summary_cards(summary))), summary_cards(summary)):
        col.metric(label, value)
    left, right = st.columns(2)
    left.caption("ONNX ops (before folding)")
    left.dataframe(pd.DataFrame([{"op": k, "count": v} for k, v in loaded.onnx_ops.items()]),
                   hide_index=True, width="stretch")
    right.caption("Primitive stages by kind and op")
    right.dataframe(pd.DataFrame(stage_op_rows(loaded.graph)), hide_index=True, width="stretch")

st.subheader("Device and backend")
with guarded("Choosing the device"):
    devices = services.devices()
    device = st.selectbox("Device (GPU presets: datasheet figures; host: this CPU, measured on first use)",
                          devices, index=devices.index(state.device), key="device")
    cuda_ok, cuda_detail = services.cuda_status()
    backends = ["cuda", "cpu"] if cuda_ok else ["cpu"]
    backend = st.radio("Backend", backends, horizontal=True, key="backend",
                       index=backends.index(state.backend) if state.backend in backends else 0)
    if cuda_ok:
        st.success(f"CUDA device found: {cuda_detail}")
    else:
        st.info(f"No GPU here ({cuda_detail}): kernels run on the CPU backend (generated C); "
                + ("plans and modeled times are for this CPU." if device == "host"
                   else f"GPU times are modeled for the {device} preset (choose host to plan for this CPU)."))
    if (device, backend) != (state.device, state.backend):
        update_state(device=device, backend=backend)
