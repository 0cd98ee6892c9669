"""Tests for engine/runtime/budget.py: sizes, where the budget comes from, and refusals that name the
largest buffer before anything is allocated (the 200000x200000x64 input of the robustness issue)."""

from __future__ import annotations

import numpy as np
import pytest
from support import sample_path, tiny_model

import engine.api as api
from engine.device import PRESETS
from engine.errors import ShapeError, TileweaveError
from engine.frontend.importer import load_graph
from engine.ir.dtypes import DType
from engine.ir.graph import TensorSpec
from engine.runtime import budget as B


@pytest.mark.parametrize(("text", "want"), [("8GiB", 8 << 30), ("512M", 512 << 20), ("2GB", 2 * 10**9),
                                            ("1e9", 10**9), ("100kib", 102400), (4096, 4096)])
def test_parse_size(text, want):
    assert B.parse_size(text) == want


@pytest.mark.parametrize("text", ["", "x", "8 parsecs", "-5", "0", "GiB"])
def test_parse_size_refuses_garbage_in_one_line(text):
    with pytest.raises(TileweaveError) as info:
        B.parse_size(text)
    assert "\n" not in str(info.value) and "--memory-budget" in str(info.value)


def test_budget_sources():
    assert B.memory_budget("1GiB", device="h100", backend="cuda") == B.Budget(1 << 30, "--memory-budget")
    gpu = B.memory_budget(device="h100", backend="cuda")
    assert gpu.nbytes == PRESETS["h100"].memory_bytes == 80 << 30 and "datasheet" in gpu.source
    host = B.memory_budget(backend="cpu", device="h100")
    assert host.nbytes == int(B.host_memory_bytes() * B.HOST_FRACTION) and "host RAM" in host.source
    sim = B.memory_budget(device="v100", backend="cuda-sim")
    assert sim.nbytes == min(host.nbytes, PRESETS["v100"].memory_bytes)


def test_device_file_memory_bytes_is_the_gpu_budget(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text('base = "a100"\nmemory_bytes = 1048576\n')
    budget = B.memory_budget(device=str(path), backend="cuda")
    assert budget.nbytes == 1 << 20 and "file" in budget.source


def test_huge_input_is_refused_by_name_before_allocation(save_model):
    graph = load_graph(save_model(tiny_model("Relu", (200000, 200000, 64))))
    with pytest.raises(ShapeError) as info:
        B.check_graph_memory(graph, B.Budget(8 << 30, "test"))
    assert "input 'x'" in str(info.value) and "9.3 TiB" in str(info.value) and "--memory-budget" in str(info.value)
    with pytest.raises(ShapeError):  # through the API too, before inputs are even looked at
        api.run_model(graph, {}, backend="reference", budget="8GiB")


def test_total_over_budget_names_the_largest_buffer():
    graph = load_graph(sample_path("gelu_chain"))
    need = sum(n for _, _, n in B.graph_buffers(graph))
    largest = max(B.graph_buffers(graph), key=lambda t: t[2])
    assert largest[2] < need
    with pytest.raises(ShapeError) as info:
        B.check_graph_memory(graph, B.Budget(need - 1, "test"))
    assert f"'{largest[1]}'" in str(info.value)
    assert B.check_graph_memory(graph, B.Budget(need, "test")) == need


def test_program_arena_is_checked_before_binding():
    graph = load_graph(sample_path("gelu_chain"))
    inputs = api.make_inputs(graph, seed=1)
    assert all(np.abs(v).max() > 0 for v in inputs.values())
    planned, plan = api.plan_model(graph, "unfused", "a100")
    program = api.generate(plan, planned, "a100", target="c")
    total = B.check_program_memory(program, planned.specs, B.Budget(1 << 40, "test"))
    assert total >= program.memory.arena_bytes > 0
    with pytest.raises(ShapeError) as info:
        B.check_program_memory(program, planned.specs, B.Budget(total - 1, "test"))
    assert "the arena" in str(info.value)


def test_tensor_size_does_not_wrap_around():
    spec = TensorSpec("t", (1 << 40, 1 << 40), DType.F32)
    assert spec.size == 1 << 80 and spec.nbytes == 4 << 80
