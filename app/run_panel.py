"""The "Compile + run" control the Kernels and Timeline pages share: runs the current plan on the
chosen backend under st.status and shows the reference verdict."""

from __future__ import annotations

import streamlit as st

from app import services
from app.state import AppState
from app.views.tables import verdict_text


def run_panel(state: AppState, planned: services.PlanResult, *, key: str) -> services.RunResult | None:
    """Button + status; returns the (cached) result of the last run of this plan, if any. The plan runs on
    the graph it was made on (`planned.graph`)."""
    plan = planned.plan
    args = (planned.graph, plan, state.model_hash, plan.plan_hash, state.device, state.backend, state.model_path)
    clicked = st.button(f"Compile + run on {state.backend.upper()}", key=key, type="primary")
    result = None
    if clicked:
        with st.status(f"Compiling and running {plan.kernels} kernels on {state.backend}…", expanded=True) as status:
            st.write("Generating kernels and compiling…")
            result = services.run_plan(*args)
            st.write(f"Ran in {result.run_seconds:.2f} s; checked against the reference executor.")
            status.update(label="Compiled, ran and checked", state="complete", expanded=False)
    else:
        result = services.cached_run(*args)
    if result is not None:
        ok, text = verdict_text(result.max_rel_err, services.MATCH_TOLERANCE)
        (st.success if ok else st.error)(f"{state.backend.upper()} outputs {text}")
    return result
