"""Small ONNX graphs for scheduler tests (random weights, fixed seeds)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

from engine.device import get_device
from engine.frontend.importer import load_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sched_graphs import attention_model  # noqa: E402


@pytest.fixture
def attn_graph(tmp_path):
    path = tmp_path / "attn.onnx"
    onnx.save(attention_model(), path)
    return load_graph(path)


@pytest.fixture
def attn_path(tmp_path):
    path = tmp_path / "attn.onnx"
    onnx.save(attention_model(), path)
    return path


@pytest.fixture
def a100():
    return get_device("a100")
