"""The hostile corpus (tests/data/bad/) through the app's upload paths, without a browser: a model goes
through what the Model page's uploader calls (services.save_upload, services.load_model) and what the
first run calls (services.model_inputs); a plan or bundle through what the Plan and Compare pages'
uploaders call (services.read_plan_json). Each must raise a one-line TileweaveError, which `guarded`
shows as the page's message. Device files have no upload path (the app offers the presets only)."""

from __future__ import annotations

import json

import pytest
from support import ROOT, TEST_DATA

from app import services
from engine.errors import TileweaveError

BAD = TEST_DATA / "bad"
MANIFEST = json.loads((BAD / "MANIFEST.json").read_text())
UPLOADS = [e for e in MANIFEST["files"] if e["kind"] in ("model", "plan", "bundle")]
# An upload is stored alone in the cache folder, so a model's external file is looked for there.
APP_EXPECT = {"external_symlink.onnx": "is missing", "plan_not_utf8.plan.json": "not JSON",
              "plan_garbage.plan.json": "not JSON"}


def upload_model(name: str, data: bytes) -> None:
    path = services.save_upload(name, data)
    loaded = services.load_model(str(path), services.file_digest(path))
    services.model_inputs(loaded.graph, loaded.graph.structural_hash, str(path))


@pytest.mark.parametrize("entry", UPLOADS, ids=[e["file"] for e in UPLOADS])
def test_app_upload_refuses_with_a_message(entry, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path / "cache"))
    data = (BAD / entry["file"]).read_bytes()
    with pytest.raises(TileweaveError) as info:
        if entry["kind"] == "model":
            upload_model(entry["file"], data)
        else:
            services.read_plan_json(data, services.load_model(str(ROOT / MANIFEST["plan_model"]), "plan_model").graph)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert APP_EXPECT.get(entry["file"], entry["expect"]) in message, message
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.parent == tmp_path / "cache" / "uploads" for p in written), written  # the upload itself only


def test_a_good_plan_and_model_still_load(tmp_path, monkeypatch):
    """The same paths accept well-formed files (so the refusals above are about the files)."""
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path / "cache"))
    model = ROOT / MANIFEST["plan_model"]
    upload_model("gelu_chain.onnx", model.read_bytes())
    graph = services.load_model(str(model), "plan_model").graph
    good = json.loads((BAD / "plan_unknown_key.plan.json").read_text())
    del good["rogue"]
    _, plan = services.read_plan_json(json.dumps(good).encode(), graph)
    assert plan.model_hash == graph.structural_hash
