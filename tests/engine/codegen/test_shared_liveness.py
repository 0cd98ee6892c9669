"""Shared memory placed by liveness inside a segment (engine/codegen/kir.py `Kernel.buffer_lives`, `_layout`):
a block buffer lives from the first phase that stores or reads it to the last, buffers whose lives are disjoint
share bytes, and the printers (CUDA's `smem + offset`, the emulator's regions) use the same offsets. The C
target keeps an array per block buffer (a per-tile stack array): its outputs are checked beside cuda-sim's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from plans import acyclic, make_test_plan  # noqa: E402
from sample_io import load_sample  # noqa: E402
from support import max_rel_error, run_ort  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.kexpr import kformat  # noqa: E402
from engine.codegen.nvrtc import compile_cuda  # noqa: E402
from engine.codegen.targets import render_cuda  # noqa: E402
from engine.errors import CompileError, PlanError  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.schedule.plan import Conn, Tile  # noqa: E402

WIDTHS = (40, 56, 24, 48, 32)  # layer widths: activation tiles of different sizes
ROWS = 48


def _chain(path: Path, seed: int) -> Path:
    """y = relu(...relu(relu(x @ W0) @ W1)... @ W3): a four-layer MLP, random weights."""
    rng = np.random.default_rng(seed)
    nodes, inits, cur = [], [], "x"
    for k, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"W{k}"))
        nodes.append(helper.make_node("MatMul", [cur, f"W{k}"], [f"mm{k}"], name=f"mm{k}"))
        cur = f"h{k}" if k < len(WIDTHS) - 2 else "y"
        nodes.append(helper.make_node("Relu", [f"mm{k}"], [cur], name=f"relu{k}"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, WIDTHS[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, WIDTHS[-1]])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _padded(kernel) -> list[int]:
    return [-(-b.nbytes // 16) * 16 for b in kernel.locals]


def _live_peak(kernel) -> int:
    """The most bytes of block buffers live at any one phase: no layout can take less."""
    sizes, lives = _padded(kernel), kernel.buffer_lives
    phases = sum(len(s.phases) for s in kernel.segments)
    return max((sum(n for n, (lo, hi) in zip(sizes, lives) if lo <= k <= hi) for k in range(phases)), default=0)


def _named(kernel, phase) -> set[str]:
    """Block buffers a phase names in its printed expressions (the body, a tiled phase's factors) or stores."""
    exprs = [phase.body] + ([phase.gemm.a, phase.gemm.b] if phase.gemm else []) + \
        ([phase.conv.x, phase.conv.w] if phase.conv else [])
    text = " ".join(kformat(e) for e in exprs)
    return {b.name for b in kernel.locals if re.search(rf"\b{b.name}\b", text) or b.name in phase.stores}


def _check_layout(kernel) -> None:
    """Every phase that names a buffer lies in its life; buffers whose lives overlap take disjoint bytes;
    the CUDA source casts each buffer out of `smem` at its offset."""
    sizes, lives, offsets = _padded(kernel), kernel.buffer_lives, kernel.shared_offsets
    k = 0
    for seg in kernel.segments:
        for p in seg.phases:
            for i, b in enumerate(kernel.locals):
                if b.name in _named(kernel, p):
                    assert lives[i][0] <= k <= lives[i][1], (b.name, k, lives[i])
            k += 1
    for i in range(len(sizes)):
        assert offsets[i] % 16 == 0 and offsets[i] + sizes[i] <= kernel.locals_bytes
        for j in range(i):
            if lives[i][0] <= lives[j][1] and lives[j][0] <= lives[i][1]:
                assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i], \
                    (kernel.locals[i].name, kernel.locals[j].name, lives[i], lives[j])
    assert kernel.locals_bytes >= _live_peak(kernel)
    # never more than one buffer after another per segment (the layout before liveness)
    ends = np.cumsum([len(s.phases) for s in kernel.segments])
    per_seg: dict[int, int] = {}
    for n, (lo, _) in zip(sizes, lives):
        k = int(np.searchsorted(ends, lo, side="right"))
        per_seg[k] = per_seg.get(k, 0) + n
    assert kernel.locals_bytes <= max(per_seg.values(), default=0)


def test_chained_gemm_activations_share_bytes_and_match_onnxruntime_under_cuda_sim_and_c(tmp_path):
    path = _chain(tmp_path / "chain.onnx", seed=11)
    graph = load_graph(path)
    # Every GEMM's output at SHARED (a block buffer), its relu inlined into the next GEMM's factor a:
    # one segment of four tiled GEMM phases, 16 whole rows per block.
    conns = {(p, c): Conn.SHARED if graph.stage(p).reduce else Conn.REGISTER for p, c in graph.edges}
    plan = make_test_plan(graph, conns, {"y": Tile("", (16, WIDTHS[-1]), 64, ROWS // 16)})
    program = generate(plan, graph, "a100")
    (kernel,) = program.kernels
    assert len(kernel.segments) == 1 and sum(p.gemm is not None for p in kernel.segments[0].phases) == 4
    _check_layout(kernel)
    # Layer k's tile is dead once layer k+1 consumed it: the buffers take the live peak (two adjacent
    # activations), not their sum.
    assert kernel.locals_bytes == _live_peak(kernel) < sum(_padded(kernel))
    a, b = kernel.staging_bytes
    assert kernel.shared_bytes == kernel.locals_bytes + -(-a // 16) * 16 + -(-b // 16) * 16
    cuda = render_cuda(program)
    for buf, off in zip(kernel.locals, kernel.shared_offsets):
        assert f"* {buf.name} = (float*)(smem + {off});" in cuda
    assert len(set(kernel.shared_offsets)) < len(kernel.locals)  # some buffers do share bytes
    assert f".entry {kernel.name}(" in compile_cuda(cuda, name=program.name, arch="sm_80").ptx
    x = np.random.default_rng(5).standard_normal((ROWS, WIDTHS[0])).astype(np.float32)
    want = run_ort(path, {"x": x})["y"]
    sim = run_model(graph, {"x": x}, backend="cuda-sim", plan=plan, device="a100")
    assert sim.sim.ok, "\n".join(sim.sim.summary_lines())  # no race on the bytes two buffers share
    assert max_rel_error(sim.outputs["y"], want) <= 1e-4
    c = run_model(graph, {"x": x}, backend="cpu", plan=plan, device="a100")
    assert max_rel_error(c.outputs["y"], want) <= 1e-4


SAMPLES = ("nerf_mlp", "layernorm_residual", "masked_softmax", "bert_layer")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(SAMPLES), seed=st.integers(0, 2**31 - 1))
def test_buffers_with_overlapping_lives_never_share_bytes(name, seed):
    """Random plans (each edge at REGISTER, SHARED or KERNEL, kept acyclic): in every kernel generated,
    no two block buffers whose lives overlap share a byte, and every phase that names a buffer is inside
    its life."""
    graph = load_sample(name)[0]
    rng = np.random.default_rng(seed)
    levels = (Conn.REGISTER, Conn.SHARED, Conn.KERNEL)
    wanted = {e: levels[int(rng.integers(0, 3))] for e in graph.edges}
    try:
        program = generate(make_test_plan(graph, acyclic(graph, wanted)), graph, "a100")
    except (PlanError, CompileError):
        return  # a plan codegen refuses, with its reason
    for kernel in program.kernels:
        _check_layout(kernel)


@pytest.mark.parametrize("name", ["nerf_mlp"])
def test_welder_sample_layouts_hold(name):
    from plans import policy_plan

    graph = load_sample(name)[0]
    for kernel in generate(policy_plan(graph, "welder"), graph, "a100").kernels:
        _check_layout(kernel)
