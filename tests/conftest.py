"""Shared test fixtures. Helpers live in tests/support.py (import it as `support`): several test
folders define a conftest, so `from conftest import ...` would pick whichever loaded first."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest

# Planning starts cold in every test process (tests count the tile search's builds); the schedule cache's
# own tests turn it on in a folder of their own (tests/engine/schedule/test_schedcache.py).
os.environ["TILEWEAVE_SCHEDULE_CACHE"] = "off"
# The welder policy plans in-process: xdist already runs a test process per core, and a forked child beside
# each big plan would only compete with them (tests/engine/schedule/test_forked.py turns it on).
os.environ.setdefault("TILEWEAVE_PLAN_FORK", "off")


@pytest.fixture
def save_model(tmp_path):
    """save_model(model, name="m.onnx") -> path of the saved file under tmp_path."""

    def save(model: onnx.ModelProto, name: str = "m.onnx") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(model.SerializeToString())
        return path

    return save
