"""The workbench's one typed state object, kept under one key of `st.session_state`.

This is the only module that touches `st.session_state`; the edit-list operations are pure
functions on `AppState` so they can be tested without Streamlit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import streamlit as st

from engine.memo import Caches
from engine.schedule.plan import Edit

KEY = "tileweave_state"
CACHES_KEY = "engine_caches"  # (model hash, the session's compiler memo tables for that model)


@dataclass(frozen=True)
class AppState:
    model_name: str = ""  # sample name or uploaded file name; "" until the default sample loads
    model_path: str = ""
    model_hash: str = ""  # PrimGraph.structural_hash of the loaded model
    device: str = "a100"
    backend: str = "cpu"
    base_policy: str = ""  # "" = the default policy (welder)
    batching: bool = True  # welder: operator batching (Q/K/V-style contractions merged), Plan page toggle
    edits: tuple[Edit, ...] = ()
    redo: tuple[Edit, ...] = ()
    apply_to_layers: bool = False
    restored_for: str = ""  # model hash whose autosaved edits were already restored
    notice: str = ""  # one message carried across a rerun (e.g. why an edit was refused)
    running: str = ""  # key of the run panel whose compile/run is in flight ("" when none)
    # Tile-graph selection, by stage names so it survives edits: ("kernel", a stage of it) or
    # ("edge", producer, consumer) of one tensor edge between kernels; () when nothing is selected.
    selection: tuple[str, ...] = ()


def get_state() -> AppState:
    """The session's state, created on first use."""
    if KEY not in st.session_state:
        st.session_state[KEY] = AppState()
    return st.session_state[KEY]


def session_caches(model_hash: str) -> Caches:
    """The session's compiler memo tables (engine/memo.py: Streamlit runs sessions on threads, and a
    session's tables go with it) for the current model only: a new model starts empty tables and the
    previous model's are dropped. Entries are pure functions of their keys, so dropping them costs time
    when the user comes back to a model, never a result; keeping every model's tables made a long
    session's heap, and every garbage collection over it, grow model by model."""
    held = st.session_state.get(CACHES_KEY)
    if held is None or held[0] != model_hash:
        held = st.session_state[CACHES_KEY] = (model_hash, Caches(f"workbench session, model {model_hash or '(none)'}"))
    return held[1]


def set_state(state: AppState) -> AppState:
    st.session_state[KEY] = state
    return state


def widget_value(key: str, default=None):
    """A widget's value from the previous rerun, read before the widget is drawn (a chart's click)."""
    return st.session_state.get(key, default)


def update_state(**changes) -> AppState:
    """Replace some fields of the session's state and return the new state."""
    return set_state(dataclasses.replace(get_state(), **changes))


# ---- pure edit-list operations ----------------------------------------------------------------


def push_edits(state: AppState, edits: tuple[Edit, ...] | list[Edit]) -> AppState:
    """Append edits (one user action may add several: 'apply to all identical layers'); a new
    action forgets the redo stack, as in every editor."""
    return dataclasses.replace(state, edits=state.edits + tuple(edits), redo=())


def undo(state: AppState) -> AppState:
    if not state.edits:
        return state
    return dataclasses.replace(state, edits=state.edits[:-1], redo=(state.edits[-1],) + state.redo)


def redo(state: AppState) -> AppState:
    if not state.redo:
        return state
    return dataclasses.replace(state, edits=state.edits + (state.redo[0],), redo=state.redo[1:])


def clear_edits(state: AppState) -> AppState:
    return dataclasses.replace(state, edits=(), redo=())


def switch_model(state: AppState, name: str, path: str, model_hash: str) -> AppState:
    """A new model starts with no edits; autosaved ones are restored by the caller."""
    if state.model_hash == model_hash and state.model_path == path:
        return state
    return dataclasses.replace(state, model_name=name, model_path=path, model_hash=model_hash,
                               edits=(), redo=(), restored_for="", notice="", selection=())
