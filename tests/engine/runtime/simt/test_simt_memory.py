"""Tests for engine/runtime/simt/memory.py: the shared-memory regions found on the printed declaration lines,
so an index past a block buffer (into the buffer after it) is out of range although still in shared memory."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simt_samples import sample  # noqa: E402

from engine.codegen.api import kernel_units  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.runtime.simt import run_simt  # noqa: E402
from engine.runtime.simt.memory import Memory, SharedRegion, garbage, shared_regions  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402


def _layernorm():
    graph, inputs, want = sample("layernorm_residual")
    graph, plan = plan_model(graph, "welder", "a100")
    program = generate(plan, graph, "a100", target="cuda")
    (kernel,) = program.kernels
    (name, src), = kernel_units(program)
    return graph, inputs, program, kernel, src


def test_regions_of_block_buffers_and_reduction_slots() -> None:
    _, _, _, kernel, src = _layernorm()
    lines = src.splitlines()
    regions = shared_regions(kernel, lines)
    at = {r.name: r for r in regions if r.name != "tw_red"}
    assert {n: (r.offset, r.size) for n, r in at.items()} == {
        b.name: (off, b.capacity * 4) for b, off in zip(kernel.locals, kernel.shared_offsets)}
    for r in at.values():
        assert f" {r.name} = (float*)(smem + {r.offset});" in lines[r.line - 1]
    red = [r for r in regions if r.name == "tw_red"]
    assert red and all(lines[r.line - 1].strip() == "float* red = (float*)tw_red;" for r in red)
    assert {(r.offset, r.size) for r in red} == {(kernel.shared_bytes - kernel.reduce_scratch_bytes,
                                                  8 * (kernel.threads // 32))}
    assert all(isinstance(r, SharedRegion) for r in regions)


def test_index_past_a_block_buffer_is_out_of_range_though_still_in_shared_memory() -> None:
    graph, inputs, program, kernel, src = _layernorm()
    first = kernel.locals[0]
    assert len(kernel.locals) > 1  # past its end is the next buffer: in shared memory, not in this buffer
    lines = src.splitlines()
    n = next(k for k, text in enumerate(lines) if text.strip().startswith(f"{first.name}[") and "] = " in text)
    lines[n] = lines[n].replace(f"{first.name}[", f"{first.name}[{first.capacity} + ", 1)
    _, report = run_simt(program, graph.specs, inputs, graph.weights, sources={kernel.name: "\n".join(lines) + "\n"},
                         grid_cap=2)
    oor = [f for f in report.findings if f.kind == "out_of_range"]
    assert [(f.buffer, f.line) for f in oor] == [(first.name, n + 1)]
    assert f"outside its {first.capacity} elements" in oor[0].message


def test_forgotten_arena_tensors_read_as_never_written() -> None:
    mem = Memory()
    try:
        arena = np.zeros(64, np.uint8)
        shadow = np.full(16 * mem.cell, 0xFF, np.uint8)
        mem.add("a", arena[:32].view(np.float32), tracked=True, shadow=(shadow, 0), shift=2)
        mem.add("b", arena[32:].view(np.float32), tracked=True, shadow=(shadow, 8), shift=2)
        mem.mark_written("a")
        mem.mark_written("b")
        mem.forget("b")
        words = shadow.view(np.uint32).reshape(16, -1)
        assert (words[:8, 1] == 0xFFFFFFFE).all() and (words[8:, 1] == 0xFFFFFFFF).all()
    finally:
        mem.close()


@pytest.mark.parametrize("shape", [(), (1,), (2, 3)])
def test_garbage_fills_every_byte_at_any_rank(shape) -> None:
    # A rank-0 output (ReduceSum over every axis, keepdims=0) used to raise in numpy's byte view (graph fuzzer).
    arr = garbage(shape, np.float32)
    assert arr.shape == shape and np.isnan(arr).all()
    assert (arr.reshape(-1).view(np.uint8) == 0xFF).all()
