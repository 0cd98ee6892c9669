"""The "Compile + run" control the Kernels and Timeline pages share: runs the current plan on the
chosen backend under st.status and shows the reference verdict. Every compile and run is bounded by the
page's time limit and can be cancelled (`bounded_controls`, `run_bounded`)."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from app import services
from app.state import AppState, get_state, update_state
from app.views.tables import verdict_text
from engine.errors import TimeLimitError

KEPT = "the plan and earlier results are unchanged"


LIMIT_LABEL = "Time limit per compile / run (s)"
LIMIT_HELP = ("a compile or run that takes longer is stopped (its worker process killed) and reported; raise it "
              "for large models")


def bounded_controls(key: str, label: str, *, limit_label: str = LIMIT_LABEL, limit_help: str = LIMIT_HELP,
                     default: float | None = None) -> tuple[bool, float, bool]:
    """(start clicked, time limit in seconds, Cancel clicked): the start button under `key`, the limit
    (`default`, else TILEWEAVE_TIME_LIMIT, else 300 s) and Cancel, side by side."""
    go, limit_col, cancel_col = st.columns([2, 2, 1], vertical_alignment="bottom")
    clicked = go.button(label, key=key, type="primary")
    limit = limit_col.number_input(limit_label, min_value=0.01, max_value=86400.0,
                                   value=default or services.default_time_limit(), key=f"{key}_limit",
                                   help=limit_help)
    cancelled = cancel_col.button("Cancel", key=f"{key}_cancel", help="stop the work in progress")
    return clicked, float(limit), cancelled


def run_bounded(key: str, label: str, work: Callable, limit: float, *, clicked: bool, cancelled: bool):
    """When `clicked`: `work(time_limit=limit, poll=...)` under st.status; its result, or None when it
    ran out of time (the page says so and nothing is stored). The work runs in a worker process: Cancel
    (like any click) reruns the page, Streamlit raises its rerun signal inside `poll`, the worker is
    killed, and the rerun finds the run still marked in flight and reports it cancelled."""
    if get_state().running == key:
        update_state(running="")
        st.warning(f"{'Cancelled' if cancelled else 'Interrupted'}: {KEPT}.")
    elif cancelled:
        st.info("Nothing is running.")
    if not clicked:
        return None
    update_state(running=key)
    with st.status(label, expanded=True) as status:
        ticker = st.empty()

        def poll(elapsed: float) -> None:
            ticker.write(f"Running… {elapsed:.1f} s of at most {limit:g} s (Cancel stops it)")

        try:
            result = work(time_limit=limit, poll=poll)
        except TimeLimitError as err:
            update_state(running="")
            status.update(label="Stopped: out of time", state="error", expanded=False)
            st.error(f"{err}; {KEPT}")
            return None
        except Exception:
            update_state(running="")
            raise  # Streamlit's rerun signal (Cancel) is no Exception: the flag stays for the rerun to report
        update_state(running="")
        status.update(label="Done", state="complete", expanded=False)
    return result


def run_panel(state: AppState, planned: services.PlanResult, *, key: str) -> services.RunResult | None:
    """Button + status; returns the result of the last run of this plan, if any. The plan runs on the
    graph it was made on (`planned.graph`)."""
    plan = planned.plan
    args = (planned.graph, plan, state.model_hash, plan.plan_hash, state.device, state.backend, state.model_path)
    clicked, limit, cancelled = bounded_controls(key, f"Compile + run on {state.backend.upper()}")
    result = run_bounded(key, f"Compiling and running {plan.kernels} kernels on {state.backend}…",
                         lambda **kw: services.run_plan(*args, **kw), limit, clicked=clicked, cancelled=cancelled)
    if result is not None:
        st.caption(f"Ran in {result.run_seconds:.2f} s; checked against the reference executor.")
    else:
        result = services.cached_run(*args)
    if result is not None:
        ok, text = verdict_text(result.max_rel_err, services.MATCH_TOLERANCE)
        (st.success if ok else st.error)(f"{state.backend.upper()} outputs {text}")
    return result
