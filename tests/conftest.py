"""Shared test fixtures. Helpers live in tests/support.py (import it as `support`): several test
folders define a conftest, so `from conftest import ...` would pick whichever loaded first."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest


@pytest.fixture
def save_model(tmp_path):
    """save_model(model, name="m.onnx") -> path of the saved file under tmp_path."""

    def save(model: onnx.ModelProto, name: str = "m.onnx") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(model.SerializeToString())
        return path

    return save
