"""app/state.py edit-list operations and app/services.py autosave / plan JSON, without a browser."""

from __future__ import annotations

import json
import random

import pytest

from app import services
from app.state import AppState, clear_edits, push_edits, redo, switch_model, undo
from engine.errors import TileweaveError
from engine.schedule.plan import Edit
from engine.schedule.policies import make_plan


def random_edits(rng: random.Random, n: int) -> list[Edit]:
    conns = services.conn_choices()
    return [Edit.make("set_edge", producer=f"s{rng.randrange(50)}", consumer=f"s{rng.randrange(50)}",
                      conn=rng.choice(conns)) for _ in range(n)]


def test_undo_redo_walks_the_ordered_edit_list():
    rng = random.Random(5)
    edits = random_edits(rng, 6)
    state = AppState()
    for e in edits:
        state = push_edits(state, [e])
    assert state.edits == tuple(edits) and state.redo == ()
    back = undo(undo(state))
    assert back.edits == tuple(edits[:4]) and back.redo == tuple(edits[4:])
    assert redo(back).edits == tuple(edits[:5])
    # A new edit after undo drops what could have been redone.
    new = random_edits(rng, 1)
    branched = push_edits(back, new)
    assert branched.edits == tuple(edits[:4] + new) and branched.redo == ()
    assert undo(AppState()) == AppState() and redo(state) == state
    assert clear_edits(state).edits == ()


def test_switching_model_forgets_edits_but_same_model_keeps_them():
    state = push_edits(AppState(model_name="a", model_path="/a.onnx", model_hash="h1"), random_edits(random.Random(1), 2))
    assert switch_model(state, "a", "/a.onnx", "h1") is state
    moved = switch_model(state, "b", "/b.onnx", "h2")
    assert moved.edits == () and moved.model_hash == "h2" and moved.restored_for == ""


def test_edits_autosave_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    edits = tuple(random_edits(random.Random(9), 4)) + (
        Edit.make("set_tile", group_stage="s3", shape=[32, 64], threads=128),)
    path = services.save_edits("abc123", "stitch", edits)
    assert path == tmp_path / "edits" / "abc123.json"
    assert services.load_edits("abc123") == ("stitch", edits, True)
    services.save_edits("abc123", "welder", edits[:2], batching=False)
    assert services.load_edits("abc123") == ("welder", edits[:2], False)
    assert services.load_edits("other") is None
    path.write_text("{not json")
    assert services.load_edits("abc123") is None  # corrupt autosave is ignored, not fatal


def test_an_autosave_interrupted_mid_write_keeps_the_previous_one(tmp_path, monkeypatch):
    import io

    from engine import files

    class CrashingFile(io.FileIO):  # half the bytes reach the disk, then the write fails
        def write(self, data):
            super().write(bytes(data)[: len(data) // 2])
            super().flush()
            raise OSError(5, "Input/output error")

    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    edits = tuple(random_edits(random.Random(11), 5))
    path = services.save_edits("abc123", "stitch", edits[:3])
    before = path.read_bytes()
    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: CrashingFile(fd, "wb"))
    with pytest.raises(OSError):
        services.save_edits("abc123", "welder", edits, batching=False)
    assert path.read_bytes() == before
    assert services.load_edits("abc123") == ("stitch", edits[:3], True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["abc123.json"]


def test_upload_limits_and_plan_json_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    with pytest.raises(TileweaveError, match="upload limit"):
        services.save_upload("big.onnx", b"x" * (services.UPLOAD_LIMIT_MB * 1024 * 1024 + 1))
    with pytest.raises(TileweaveError, match="not an .onnx"):
        services.save_upload("model.txt", b"abc")
    graph = services.load_model(str(services.sample_path("gelu_chain")), "gelu").graph
    with pytest.raises(TileweaveError, match="not JSON"):
        services.read_plan_json(b"{oops", graph)
    plan = make_plan(graph, "unfused", "a100")
    text = services.plan_json_text(plan)
    assert services.read_plan_json(text.encode(), graph) == (graph, plan)
    with pytest.raises(TileweaveError, match="not a JSON object"):
        services.read_plan_json(b"[1, 2]", graph)
    other = json.loads(text) | {"model_hash": "0" * 16}
    with pytest.raises(TileweaveError, match="not this one") as err:
        services.read_plan_json(json.dumps(other).encode(), graph)
    assert "\n" not in str(err.value)


def test_max_rel_error_scales_by_the_reference():
    import numpy as np

    rng = np.random.default_rng(2)
    want = rng.standard_normal((8, 16)).astype(np.float32) + 0.5
    got = want.copy()
    got[3, 4] += 0.25
    assert services.max_rel_error(got, want) == pytest.approx(0.25 / np.abs(want).max(), rel=1e-5)
    assert services.max_rel_error(want, want) == 0.0
    assert services.max_rel_error(got[:4], want) == float("inf")
    unwritten = want.copy()
    unwritten[5, 7] = np.nan  # a never-written element (cuda-sim starts outputs as NaN) is no match
    assert services.max_rel_error(unwritten, want) == float("inf")
    want_nan = want.copy()
    want_nan[1, 2] = np.nan
    got_nan = want_nan.copy()
    got_nan[3, 4] += 0.25  # NaN where the reference has NaN matches; the rest scales by its finite part
    assert services.max_rel_error(got_nan, want_nan) == pytest.approx(0.25 / np.nanmax(np.abs(want_nan)), rel=1e-5)


@pytest.fixture(scope="module")
def bert():
    return services.load_model(str(services.sample_path("bert_layer")), "bert_layer").graph


def test_welder_plans_carry_the_batched_graph_and_the_toggle_turns_it_off(bert):
    on = services.build_plan(bert, bert.structural_hash, "welder", "a100", "[]", True)
    off = services.build_plan(bert, bert.structural_hash, "welder", "a100", "[]", False)
    assert on.plan.model_hash == on.graph.structural_hash != bert.structural_hash
    # cached on the model hash: the graph may be another load of the same model, so compare hashes
    assert off.graph.structural_hash == off.plan.model_hash == bert.structural_hash
    assert services.plan_batching(on.plan) and not services.plan_batching(off.plan)
    assert sum(1 for s in on.graph.stages if s.name.endswith(".batched")) == 1
    stitch = services.build_plan(bert, bert.structural_hash, "stitch", "a100", "[]", True)
    assert stitch.graph.structural_hash == bert.structural_hash and not services.plan_batching(stitch.plan)  # batching is welder's alone
    # A saved batched plan loads back onto the batched graph (the plain load would refuse its hash).
    graph, plan = services.read_plan_json(services.plan_json_text(on.plan).encode(), bert)
    assert plan == on.plan and graph.structural_hash == on.graph.structural_hash


def test_edits_name_stages_of_the_batched_graph(bert):
    on = services.build_plan(bert, bert.structural_hash, "welder", "a100", "[]", True)
    seg = next(t for g in on.plan.groups for t in g.segments if t.stage.endswith(".batched"))
    edit = Edit.make("set_tile", stage=seg.stage, shape=[1, 64, 128], threads=256)
    graph, plan = services.plan_with_edits(bert, "welder", "a100", (edit,), True)
    got = next(t for g in plan.groups for t in g.segments if t.stage == seg.stage)
    assert got.shape == (1, 64, 128) and got != seg and graph.structural_hash == plan.model_hash
    key = services.edits_key((edit,))
    refused = services.build_plan(bert, bert.structural_hash, "welder", "a100", key, False).refused
    assert [k for k, _ in refused] == [0] and ".batched" in refused[0][1]  # no such stage without batching


def test_bundle_bytes_is_the_engine_kernel_bundle(tmp_path, monkeypatch):
    import io
    import zipfile

    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    graph = services.load_model(str(services.sample_path("gelu_chain")), "gelu_chain").graph
    result = services.build_plan(graph, graph.structural_hash, "welder", "a100", "[]", True)
    data = services.bundle_bytes(result.graph, result.plan, graph.structural_hash, result.plan.plan_hash, "a100")
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = set(z.namelist())
        assert {"manifest.json", "plan.json", "program.json", "trace.json"} <= names
        assert any(n.endswith(".sm_80.cubin") for n in names) and any(n.endswith(".c") for n in names)
        assert json.loads(z.read("plan.json")) == json.loads(services.plan_json_text(result.plan))


def _session_caches_script() -> None:
    """Run as the app's entry script runs it: the session's memo tables for the model in
    st.session_state["model"], one entry put per run, what each run saw recorded."""
    import streamlit as st

    from app.state import session_caches

    model = st.session_state.get("model", "m1")
    caches = session_caches(model)
    table = caches.memo("test.table", 100)
    seen = len(table)
    table.put((model, len(st.session_state.get("runs", []))), 1)
    st.session_state["runs"] = [*st.session_state.get("runs", []), (model, id(caches), seen)]


def test_a_session_keeps_the_memo_tables_of_its_current_model_only():
    """Reruns on one model share its tables; another model starts empty tables and the old ones are
    dropped; coming back starts again (entries are pure functions of their keys: dropping them costs
    time, never a result). A long session held every model's tables: 1.1 M objects after six zoo models,
    walked by every garbage collection (benchmarks/NOTES.md, wbperf)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_session_caches_script)
    at.run()
    at.run()
    at.session_state["model"] = "m2"
    at.run()
    at.session_state["model"] = "m1"
    at.run()
    runs = at.session_state["runs"]
    assert [(m, seen) for m, _, seen in runs] == [("m1", 0), ("m1", 1), ("m2", 0), ("m1", 0)]
    ids = [i for _, i, _ in runs]
    assert ids[0] == ids[1] != ids[2] != ids[3]  # each new one made while the one it replaces is alive


def test_the_workbench_config_turns_off_streamlits_collection_after_every_run():
    """Streamlit's default runs gc.collect() after each page run; over a session's planned models that
    took seconds per page and held the GIL, so a rerun the browser asked for meanwhile (a click) waited,
    and a file dropped on the uploader then was lost to it (NOTES.md, wbperf)."""
    import tomllib

    config = tomllib.loads((services.ROOT / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False
