"""engine/schedule/schedcache.py: the tile search's answers kept on disk between processes — a model planned
again (in a fresh set of memo tables, as a new process has) searches nothing and gets the same plan; the
file is per code version and device; a damaged file or a failed write never fails a plan."""

from __future__ import annotations

import json

import pytest
from support import sample_path

from engine.device import get_device
from engine.errors import TileweaveError
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule import schedcache, tiles
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import plan_to_json


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    monkeypatch.setenv("TILEWEAVE_SCHEDULE_CACHE", "on")
    return tmp_path / "schedule"


def _plan(name: str, device: str = "a100", policy: str = "welder") -> tuple[dict, int]:
    """The plan (JSON, without its timing) made in fresh memo tables, and how many tile searches ran."""
    passes = [0]
    search = tiles._search_pass

    def counted(*a, **k):
        passes[0] += 1
        return search(*a, **k)

    tiles._search_pass = counted
    try:
        with Caches("a new process").active():
            _, plan = plan_model(load_graph(sample_path(name)), policy, get_device(device))
    finally:
        tiles._search_pass = search
    out = plan_to_json(plan)
    out.pop("schedule_seconds", None)
    return out, passes[0]


def test_a_model_planned_again_searches_nothing_and_gets_the_same_plan(cache_on):
    cold, searched = _plan("bert_layer")
    assert searched > 20
    files = list(cache_on.glob("*.pkl"))
    assert len(files) == 1
    warm, again = _plan("bert_layer")
    assert again == 0
    assert json.dumps(warm, sort_keys=True) == json.dumps(cold, sort_keys=True)


def test_off_writes_nothing_and_a_bad_value_is_one_line(cache_on, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_SCHEDULE_CACHE", "off")
    _, searched = _plan("layernorm_residual")
    assert searched and not cache_on.exists()
    monkeypatch.setenv("TILEWEAVE_SCHEDULE_CACHE", "maybe")
    with pytest.raises(TileweaveError, match="TILEWEAVE_SCHEDULE_CACHE='maybe' is not on or off"):
        _plan("layernorm_residual")


def test_each_device_and_code_version_has_a_file_of_its_own(cache_on, monkeypatch):
    _plan("layernorm_residual", "a100")
    _plan("layernorm_residual", "h100")
    assert len(list(cache_on.glob("*.pkl"))) == 2
    monkeypatch.setattr(schedcache, "_VERSION", ["0123456789abcdef"])  # an edited engine source
    _, searched = _plan("layernorm_residual", "a100")
    assert searched  # the other version's answers are not used
    assert len(list(cache_on.glob("0123456789abcdef-*.pkl"))) == 1


def test_a_damaged_or_unwritable_file_never_fails_a_plan(cache_on, monkeypatch):
    cold, _ = _plan("layernorm_residual")
    (path,) = cache_on.glob("*.pkl")
    path.write_bytes(b"not a pickle")
    again, searched = _plan("layernorm_residual")
    assert searched and again == cold  # read as empty, searched, and written afresh
    assert _plan("layernorm_residual")[1] == 0

    def refuse(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("engine.files.write_atomic", refuse)
    assert _plan("gelu_chain")[0]["policy"] == "welder"  # planned; the cache just is not written
    blocked = cache_on.parent / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv("TILEWEAVE_CACHE", str(blocked))  # no cache folder can be made there
    assert _plan("masked_softmax")[0]["policy"] == "welder"


def test_models_planned_in_turn_share_one_file(cache_on):
    _plan("layernorm_residual")
    _plan("gelu_chain")
    assert _plan("layernorm_residual")[1] == 0 and _plan("gelu_chain")[1] == 0


def test_older_code_versions_leave_the_folder_this_ones_files_stay(cache_on, monkeypatch):
    monkeypatch.setattr(schedcache, "VERSIONS", 2)
    for version in ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc"):
        monkeypatch.setattr(schedcache, "_VERSION", [version])
        _plan("layernorm_residual", "a100")
        _plan("layernorm_residual", "h100")
    names = sorted(f.name.split("-")[0] for f in cache_on.glob("*.pkl"))
    assert names == ["bbbbbbbbbbbbbbbb"] * 2 + ["cccccccccccccccc"] * 2
