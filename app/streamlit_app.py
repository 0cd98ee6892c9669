"""Entry point: `streamlit run app/streamlit_app.py`. Registers the pages with st.navigation and
runs the selected one inside the error guard."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

# `streamlit run app/streamlit_app.py` puts app/ (not the repo root) on sys.path.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from app.state import get_state, session_caches  # noqa: E402
from app.ui import guarded  # noqa: E402

PAGES = Path(__file__).parent / "pages"

st.set_page_config(page_title="tileweave", page_icon=":material/grid_view:", layout="wide")
nav = st.navigation([
    st.Page(PAGES / "model.py", title="Model", icon=":material/inventory_2:", default=True),
    st.Page(PAGES / "tilegraph.py", title="Tile-graph", icon=":material/hub:"),
    st.Page(PAGES / "plan.py", title="Plan", icon=":material/edit:"),
    st.Page(PAGES / "kernels.py", title="Kernels", icon=":material/memory:"),
    st.Page(PAGES / "timeline.py", title="Timeline", icon=":material/timeline:"),
    st.Page(PAGES / "partition.py", title="Partition", icon=":material/device_hub:"),
    st.Page(PAGES / "compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page(PAGES / "tuning.py", title="Tuning", icon=":material/speed:"),
    st.Page(PAGES / "export.py", title="Export", icon=":material/download:"),
])
# Each browser session plans with its own memo tables (engine/memo.py), kept for its current model only.
with guarded(f"The {nav.title} page"), session_caches(get_state().model_hash).active():
    nav.run()
