"""Glue the pages share: error guard (no traceback reaches the page), the current model and plan
from state + services, and autosaving the user's edits."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from app import services
from app.state import AppState, get_state, push_edits, set_state, switch_model, update_state
from engine.errors import TileweaveError
from engine.schedule.plan import Edit


@contextmanager
def guarded(what: str) -> Iterator[None]:
    """TileweaveError → its one-line message; anything else → a short message and the details in
    an expander. Streamlit's own stop/rerun signals are BaseExceptions and pass through."""
    try:
        yield
    except TileweaveError as err:
        st.error(str(err))
    except Exception as err:
        st.error(f"{what} failed unexpectedly ({type(err).__name__}). Try another model or plan; "
                 "if it persists, report it with the details below.")
        with st.expander("Details"):
            st.code("".join(traceback.format_exception(err)), language="text")


def load_into_state(name: str, path: str) -> AppState:
    """Load a model file, make it current, and restore its autosaved edits once."""
    loaded = services.load_model(path, services.file_digest(path))
    state = set_state(switch_model(get_state(), name, path, loaded.graph.structural_hash))
    if state.restored_for != state.model_hash:
        saved = services.load_edits(state.model_hash)
        changes = {"restored_for": state.model_hash}
        if saved:
            policy, edits, batching = saved
            changes |= {"edits": edits, "redo": (), "batching": batching}
            if policy in services.policies():
                changes["base_policy"] = policy
        state = update_state(**changes)
    return state


def current_model() -> tuple[AppState, services.LoadedModel]:
    state = get_state()
    if not state.model_path:
        sample = services.default_sample()
        state = load_into_state(sample["name"], str(services.sample_path(sample["name"])))
    loaded = services.load_model(state.model_path, services.file_digest(state.model_path))
    if not state.base_policy:
        state = update_state(base_policy=services.default_policy())
    return state, loaded


def current_plan(state: AppState, loaded: services.LoadedModel) -> services.PlanResult:
    """The current plan with the graph it was made on (`.graph`: operator-batched for welder)."""
    with st.spinner(f"Planning {state.model_name} with {state.base_policy} (once per model, policy and edits)…"):
        return services.build_plan(loaded.graph, state.model_hash, state.base_policy, state.device,
                                   services.edits_key(state.edits), state.batching)


def commit_state(state: AppState) -> AppState:
    """Store a new state and autosave its edits for the model (restored after reload/restart)."""
    set_state(state)
    if state.model_hash:
        services.save_edits(state.model_hash, state.base_policy, state.edits, state.batching)
    return state


def show_notice() -> None:
    state = get_state()
    if state.notice:
        st.warning(state.notice)


def submit_edits(state: AppState, loaded: services.LoadedModel, edits: list[Edit]) -> None:
    """Validate the edit list with the new edits; keep them (autosaved, undoable) only if the engine
    accepts them all, else show the rule the first refused one breaks."""
    try:
        with st.spinner("Validating the edit…"):
            services.check_edits(loaded.graph, state.model_hash, state.base_policy, state.device,
                                 state.edits + tuple(edits), state.batching)
    except TileweaveError as err:
        st.error(f"Refused: {err}")
        return
    commit_state(push_edits(state, edits))
    st.rerun()
