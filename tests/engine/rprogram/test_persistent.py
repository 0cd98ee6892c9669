"""Tests for engine/rprogram/persistent.py: the persistent program's outputs match onnxruntime on the CPU
backend for every sample; the CUDA version compiles with NVRTC."""

from __future__ import annotations

import dataclasses
import json
import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from engine.codegen.generate import generate
from engine.device import get_device, wave_grid
from engine.frontend.importer import load_graph
from engine.rprogram.model import RProgramError, rprogram_from_json, rprogram_to_json
from engine.rprogram.persistent import (
    compile_persistent_cuda,
    modeled_grid,
    persistent_c,
    persistent_cuda,
    persistent_schedule,
)
from engine.rprogram.persistent_run import run_persistent_c
from engine.rprogram.trace import export_trace, validate_trace
from engine.rprogram.wavefront import build_rprogram, check_rprogram, plan_for_rprogram, split_grid_barriers
from engine.schedule.policies import make_plan
from engine.schedule.validate import validate

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
CATALOG = {e["name"]: e for e in json.loads((SAMPLES / "catalog.json").read_text())}
A100 = get_device("a100")
FAST = [n for n in CATALOG if n != "bert12"]


@cache
def _built(name: str, policy: str = "welder"):
    """The rProgram with kernel variants, and the program generated for the tiles it chose."""
    graph = load_graph(SAMPLES / CATALOG[name]["file"])
    plan = make_plan(graph, policy, A100)
    rp = build_rprogram(plan, A100, graph=graph)
    plan = plan_for_rprogram(plan, rp, graph, A100)
    return graph, plan, generate(plan, graph, A100), rp


def _oracle(name: str, graph) -> tuple[dict, dict]:
    """Inputs and onnxruntime outputs: stored ones, or fixed-seed inputs run through onnxruntime live."""
    entry = CATALOG[name]
    if entry.get("io"):
        io = np.load(SAMPLES / entry["io"])
        return {t.name: io[t.name] for t in graph.inputs}, {k: io[k] for k in graph.output_names}
    import onnxruntime as ort

    rng = np.random.default_rng(7)
    feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype.np) for t in graph.inputs}
    sess = ort.InferenceSession(str(SAMPLES / entry["file"]), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return feeds, dict(zip(names, sess.run(names, feeds)))


def _assert_matches(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        w = np.asarray(want[k], np.float64)
        err = np.abs(np.asarray(got[k], np.float64) - w).max() / max(np.abs(w).max(), 1e-30)
        assert err < 1e-4, f"{k}: relative error {err:.2e}"


@pytest.mark.parametrize("name", FAST + [pytest.param("bert12", marks=pytest.mark.slow)])
def test_persistent_c_matches_onnxruntime(name: str) -> None:
    graph, _, program, rp = _built(name)
    assert check_rprogram(rp) == []
    feeds, want = _oracle(name, graph)
    _assert_matches(run_persistent_c(program, rp, graph, feeds), want)


def test_grid_barriers_become_dependencies_between_rprogram_kernels() -> None:
    # Stitch puts layernorm_residual's reductions behind grid barriers; the rProgram cuts each barrier
    # into a kernel boundary (its dependency does the barrier's job), so every kernel is an rTask.
    graph = load_graph(SAMPLES / CATALOG["layernorm_residual"]["file"])
    plan = make_plan(graph, "stitch", A100)
    assert any(len(g.segments) > 1 for g in plan.groups)
    split = split_grid_barriers(plan, graph, A100)
    assert all(len(g.segments) == 1 for g in split.groups) and validate(split, graph, A100) == []
    assert sorted(s for g in split.groups for s in g.stages) == sorted(s for g in plan.groups for s in g.stages)
    assert [t for g in split.groups for t in g.segments] == [t for g in plan.groups for t in g.segments]
    _, _, program, rp = _built("layernorm_residual", "stitch")
    assert all(len(k.segments) == 1 for k in program.kernels)
    feeds, want = _oracle("layernorm_residual", graph)
    _assert_matches(run_persistent_c(program, rp, graph, feeds), want)
    src, _ = compile_persistent_cuda(program, rp, arch="sm_80")
    assert src.source.count("case ") == len(rp.operators)


def test_cooperative_kernels_run_as_a_unit_in_c_and_are_refused_in_cuda() -> None:
    # Without the graph the rProgram keeps the plan's kernels whole (grid barriers inside).
    graph = load_graph(SAMPLES / CATALOG["layernorm_residual"]["file"])
    plan = make_plan(graph, "stitch", A100)
    rp = build_rprogram(plan, A100, variants=False)
    program = generate(plan, graph, A100)
    assert any(len(k.segments) > 1 for k in program.kernels)
    src = persistent_c(program, rp)
    assert "if (b != 0) return 0;" in src.source
    feeds, want = _oracle("layernorm_residual", graph)
    _assert_matches(run_persistent_c(program, rp, graph, feeds), want)
    with pytest.raises(RProgramError, match="grid barriers"):
        compile_persistent_cuda(program, rp)


@pytest.mark.parametrize("name,arch", [("bert_layer", "sm_80"), ("lstm", "sm_90"), ("conv_bn_relu", "sm_80")])
def test_persistent_cuda_compiles(name: str, arch: str) -> None:
    _, _, program, rp = _built(name)
    src, binary = compile_persistent_cuda(program, rp, arch=arch)
    assert src.grid == rp.vdevice.veus  # one resident wave: a block per vEU
    assert src.block == max(k.threads for k in program.kernels)
    ptx = binary.ptx if isinstance(binary.ptx, str) else binary.ptx.decode()
    assert "tw_persistent" in ptx
    # Tasks of fewer threads synchronise their own warps: __barrier_sync_count(1, n) is barrier 1 of n threads.
    named = {k.threads for k in program.kernels if f"__barrier_sync_count(1, {k.threads});" in src.source}
    assert named <= {k.threads for k in program.kernels if k.threads < src.block}
    if len({k.threads for k in program.kernels}) > 1:  # tasks at several block sizes (bert_layer's)
        assert named
    assert named == {int(n) for n in re.findall(r"barrier\.sync(?:\.aligned)?\s+1,\s*(\d+);", ptx)}
    # Every rTask appears once in the per-vEU tables.
    assert src.source.count("case ") == len(rp.operators)


def test_lstm_recurrent_kernels_run_as_split_variants() -> None:
    # The per-step GEMMs fill a few SMs: the rProgram picks finer tiles, and the program runs them.
    _, plan, program, rp = _built("lstm")
    split = [op.name for op in rp.operators if rp.chosen(op.name).origin == "split"]
    assert validate_trace(export_trace(rp)) == []
    assert rprogram_from_json(json.loads(json.dumps(rprogram_to_json(rp)))) == rp
    assert split and all(program.kernel(n).ntiles == rp.chosen(n).blocks for n in split)
    assert all("rProgram variant split" in plan.group_of(plan.groups[k].stages[0]).reason
               for k, g in enumerate(plan.groups) if g.name in split)


def test_refuses_an_rprogram_of_another_shape() -> None:
    graph, plan, program, rp = _built("gelu_chain")
    op = rp.operators[0]
    wider = dataclasses.replace(op, variants=(dataclasses.replace(op.variants[0], blocks=op.variants[0].blocks + 1),))
    with pytest.raises(RProgramError, match="variants=False"):
        persistent_c(program, dataclasses.replace(rp, operators=(wider, *rp.operators[1:])))
    renamed = dataclasses.replace(rp, operators=(dataclasses.replace(op, name="nope"), *rp.operators[1:]))
    with pytest.raises(RProgramError, match="has no kernel"):
        persistent_c(program, renamed)


@pytest.mark.parametrize("seed", range(6))
def test_folded_schedules_cannot_deadlock(seed: int) -> None:
    # Blocks walking their lists in task order, waiting on dependency counters. Counters only grow, so a
    # block that can go on stays able to: sweeping the blocks until none moves reaches the state every
    # interleaving of resident blocks reaches. Every rTask must be done there, for every grid.
    from rprogram_plans import random_plan

    rp = build_rprogram(random_plan(seed), A100, variants=False)
    blocks = {op.name: rp.chosen(op.name).blocks for op in rp.operators}
    deps = {op.name: op.deps for op in rp.operators}
    names = [op.name for op in rp.operators]
    for grid in sorted({1, 2, 7, max(1, rp.vdevice.veus // 3), rp.vdevice.veus}):
        sched = persistent_schedule(rp, grid)
        starts, n = sched[:grid + 1], int(sched[grid])
        ops, tiles = sched[grid + 1:grid + 1 + n], sched[grid + 1 + n:]
        seen = sorted((names[o], int(b)) for o, b in zip(ops, tiles))
        assert seen == sorted((t.op, t.block) for ts in rp.veus for t in ts)  # every rTask once
        at = [int(starts[b]) for b in range(grid)]
        done = dict.fromkeys(names, 0)
        moved = True
        while moved:
            moved = False
            for b in range(grid):
                while at[b] < starts[b + 1] and all(done[d] == blocks[d] for d in deps[names[ops[at[b]]]]):
                    done[names[ops[at[b]]]] += 1
                    at[b] += 1
                    moved = True
        stuck = [b for b in range(grid) if at[b] < starts[b + 1]]
        assert not stuck, f"grid {grid}: blocks {stuck[:5]} wait on tasks no block can reach"


def _task_bodies(source: str) -> dict[str, str]:
    parts = source.split("__device__ void ")[1:]
    return {p.split("(", 1)[0]: p.split("\n}\n", 1)[0] for p in parts}  # up to the closing brace


def test_each_task_runs_on_the_threads_it_was_generated_for() -> None:
    # vit_block mixes kernels of fewer threads (96, 128) with 256-thread ones in one 256-thread persistent
    # block: the smaller tasks skip their extra threads and synchronise only their own warps.
    _, _, program, rp = _built("vit_block")
    src = persistent_cuda(program, rp)
    sizes = {k.threads for k in program.kernels}
    assert src.block == 256 and 256 in sizes and min(sizes) < 256
    bodies = _task_bodies(src.source)
    for k in program.kernels:
        body = bodies[f"{k.name}_s0"]
        assert "blockDim.x" not in body
        if k.threads < src.block:
            assert f"threadIdx.x < {k.threads})" in body and "__syncthreads" not in body
            if "__barrier_sync_count" in body:
                assert all(f"__barrier_sync_count(1, {k.threads});" in line
                           for line in body.splitlines() if "__barrier_sync" in line)
        else:
            assert "threadIdx.x < " not in body.split("{", 2)[1] and "__barrier_sync" not in body
    odd = dataclasses.replace(program.kernels[0], threads=48)
    with pytest.raises(RProgramError, match="48 threads per block, not whole warps"):
        persistent_cuda(dataclasses.replace(program, kernels=(odd, *program.kernels[1:])), rp)


def test_persistent_grid_is_what_the_compiled_registers_leave_resident() -> None:
    # vit_block's rProgram assumed a small register count (two blocks per SM: 216 vEUs on an A100); the
    # compiled persistent kernel needs far more. On an A100 its 256-thread blocks still fit two per SM; on a
    # GPU with half the register file one wave holds one per SM, and the vEUs fold.
    _, _, program, rp = _built("vit_block")
    src, binary = compile_persistent_cuda(program, rp, arch="sm_80")
    used = binary.resources("tw_persistent")
    regs = used.registers
    assert regs > rp.vdevice.regs_per_thread
    for device in (A100, dataclasses.replace(A100, regs_per_sm=A100.regs_per_sm // 2)):
        grid, why = modeled_grid(src, binary, device)
        assert (grid, why) == wave_grid(device, rp.vdevice.veus, src.block, regs,
                                        src.shared_bytes + used.static_shared_bytes)
    per_sm = device.regs_per_sm // (regs * src.block)
    assert per_sm >= 1 and grid == per_sm * device.sm_count < rp.vdevice.veus and f"{regs} registers" in why


def test_rprogram_variants_and_persistent_kernels_carry_thread_mappings() -> None:
    """vit_block's GEMM kernels: every variant carries its tile's thread mapping (through the rProgram's
    JSON too), the plan rewritten for the rProgram keeps the chosen variant's, and the program the
    persistent kernel is made of prints each recorded mapping; the persistent C run matches onnxruntime."""
    graph, plan, program, rp = _built("vit_block")
    assert any(v.thread_shape for op in rp.operators for v in op.variants)
    assert rprogram_from_json(json.loads(json.dumps(rprogram_to_json(rp)))) == rp
    for op in rp.operators:
        (g,) = [g for g in plan.groups if g.name == op.name]
        v = rp.chosen(op.name)
        # a candidate chosen without a recorded mapping runs (and the rewritten plan records) the default
        assert v.origin == "plan" or v.thread_shape in ((), g.segments[0].thread_shape)
    kernels = {k.name: k for k in program.kernels}
    printed = 0
    for g in plan.groups:
        for seg, tile in zip(kernels[g.name].segments, g.segments):
            for p in seg.phases:
                if p.gemm is not None and tile.thread_shape:
                    assert (p.gemm.ty, p.gemm.tx) == tile.thread_shape, (g.name, tile)
                    printed += 1
    assert printed
    src = persistent_cuda(program, rp).source
    assert "tw_persistent" in src
    feeds, want = _oracle("vit_block", graph)
    _assert_matches(run_persistent_c(program, rp, graph, feeds), want)
