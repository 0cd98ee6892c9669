"""Tests for engine/bundle/read.py: a well-formed bundle reads back and its plan loads through
--plan-in; unsafe entries are refused (the hostile corpus covers each kind through the CLI)."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import pytest
from support import sample_path

from engine.bundle.read import bundle_plan_json, read_bundle
from engine.cli import main
from engine.errors import BundleError
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import load_plan, plan_model
from engine.schedule.plan import plan_to_json


def make_zip(files: dict[str, bytes]) -> bytes:
    files = files | {"manifest.json": json.dumps(
        {"sha256": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}).encode()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_bundle_plan_loads_through_plan_in(tmp_path, capsys):
    graph, plan = plan_model(load_graph(sample_path("gelu_chain")), "stitch", "a100")
    path = tmp_path / "b.zip"
    path.write_bytes(make_zip({"plan.json": json.dumps(plan_to_json(plan)).encode(), "README.md": b"hi"}))
    assert set(read_bundle(path)) == {"plan.json", "README.md", "manifest.json"}
    assert bundle_plan_json(path) == plan_to_json(plan)
    assert load_plan(path, load_graph(sample_path("gelu_chain")))[1] == plan
    assert main(["plan", str(sample_path("gelu_chain")), "--plan-in", str(path)]) == 0
    assert "k00" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "needle"), [("../x", "outside the bundle"), ("/abs", "outside the bundle"),
                                              ("a/../../x", "outside the bundle"), ("C:/x", "outside the bundle")])
def test_unsafe_names_are_refused(name, needle):
    with pytest.raises(BundleError, match=needle) as info:
        read_bundle(make_zip({"plan.json": b"{}", name: b"x"}))
    assert "\n" not in str(info.value)
