"""Tests for engine/runtime/simt/persistent.py: the persistent rProgram kernel of every sample under cuda-sim
(on a 2-SM A100 vDevice, so its grid stays small) against onnxruntime and the program's own launches, launched
again on its self-reset counters and folded onto fewer blocks, and the failures a GPU would hit that the
emulator must report: a task run by more threads than it was generated for, a grid larger than residency,
counters left unreset."""

from __future__ import annotations

import dataclasses
import re
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simt_samples import NAMES, assert_matches, sample  # noqa: E402

from engine.codegen.api import kernel_units  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.device import get_device  # noqa: E402
from engine.rprogram.persistent import persistent_cuda  # noqa: E402
from engine.rprogram.wavefront import build_rprogram, plan_for_rprogram  # noqa: E402
from engine.runtime.simt import run_simt  # noqa: E402
from engine.runtime.simt.persistent import resident_blocks, run_persistent_simt  # noqa: E402
from engine.schedule.policies import make_plan  # noqa: E402

A100 = get_device("a100")
SMALL_A100 = dataclasses.replace(A100, name="a100-2sm", sm_count=2)

KNOWN: dict = {}  # (lstm's overlapping SHARED regions are stored to global memory by their owning tile only)


@cache
def _persistent(name: str):
    graph, inputs, want = sample(name)
    plan = make_plan(graph, "welder", A100)
    rp = build_rprogram(plan, SMALL_A100, graph=graph)
    plan = plan_for_rprogram(plan, rp, graph, SMALL_A100)
    return graph, generate(plan, graph, SMALL_A100), rp, inputs, want


def _cases():
    return [pytest.param(n, marks=[pytest.mark.xfail(strict=True, reason=KNOWN[n])] if n in KNOWN else [])
            for n in NAMES]


@pytest.mark.parametrize("name", _cases())
def test_persistent_kernel_matches_onnxruntime_with_zero_findings(name: str) -> None:
    graph, program, rp, inputs, want = _persistent(name)
    # Tasks generated for fewer threads than the persistent block run on their own warps and synchronise
    # them with named barrier 1 (__barrier_sync_count), the other warps waiting at __syncthreads.
    src = persistent_cuda(program, rp)
    narrow = [k for k in program.kernels if k.threads < src.block and any(
        len(s.phases) > 1 or any(p.gemm or p.conv or p.threads_per_row > 32 for p in s.phases) for s in k.segments)]
    assert ("__barrier_sync_count(1, " in src.source) == bool(narrow)
    outs, report = run_persistent_simt(program, rp, graph, inputs, device=SMALL_A100)
    assert report.ok, "\n".join(report.summary_lines())
    assert_matches(outs, want)
    # the same kernels launched one after another compute the same bits
    seq, _ = run_simt(program, graph.specs, inputs, graph.weights)
    for k in seq:
        np.testing.assert_array_equal(outs[k], seq[k])


def test_a_grid_larger_than_residency_deadlocks() -> None:
    graph, program, rp, inputs, want = _persistent("layernorm_residual")
    grid = rp.vdevice.veus
    assert resident_blocks(SMALL_A100, max(k.threads for k in program.kernels), 0) >= grid
    outs, report = run_persistent_simt(program, rp, graph, inputs, device=SMALL_A100)
    assert report.ok
    assert_matches(outs, want)
    # Fewer blocks resident than vEUs: the vEUs fold onto the blocks that are (as run_persistent_cuda does).
    outs, report = run_persistent_simt(program, rp, graph, inputs, resident=grid // 2)
    assert report.ok, "\n".join(report.summary_lines())
    assert_matches(outs, want)
    # The unfolded grid with half of it resident: a resident block spins on a dependency only a waiting
    # block computes.
    _, report = run_persistent_simt(program, rp, graph, inputs, resident=grid // 2, grid=grid)
    (f,) = report.findings
    assert f.kind == "deadlock" and "atomicAdd(&done[" in f.source
    assert f"{grid - grid // 2} block(s) not resident" in f.message and report.stopped


def test_counters_reset_by_the_last_block_serve_the_next_launch() -> None:
    graph, program, rp, inputs, want = _persistent("vit_block")
    outs, report = run_persistent_simt(program, rp, graph, inputs, device=SMALL_A100, launches=2)
    assert report.ok and report.launches == 2, "\n".join(report.summary_lines())
    assert_matches(outs, want)
    # Without the reset, the second launch's tasks find their dependencies already counted and do not wait.
    src = persistent_cuda(program, rp).source
    reset = next(line for line in src.splitlines() if "done[j] = 0u" in line)
    _, report = run_persistent_simt(program, rp, graph, inputs, device=SMALL_A100, launches=2,
                                    source=src.replace(reset, ""))
    assert report.findings and {(f.kind, f.launch) for f in report.findings} == {("race", 1)}


def test_a_task_run_by_more_threads_than_generated_reads_past_its_shared_buffer() -> None:
    # The mechanism of the persistent kernel before its tasks were guarded, built on purpose: a tiled GEMM
    # kernel generated for fewer threads than the block it is launched with, and without the guard the
    # printer now gives every thread past its micro-tile grid (`live`).
    graph, inputs, _ = sample("nerf_mlp")
    plan = make_plan(graph, "unfused", A100)
    program = generate(plan, graph, A100)
    i, launch = next((i, ln) for i, ln in enumerate(program.launches)
                     if program.kernel(ln.kernel).gemms and ln.block < 256)
    wide = dataclasses.replace(launch, block=256)
    one = dataclasses.replace(program, launches=program.launches[:i] + (wide,) + program.launches[i + 1:])
    unit = dict(kernel_units(program))[launch.kernel]
    assert "const bool live = " in unit
    unguarded = re.sub(r"const bool live = [^;]*;", "const bool live = true;", unit)
    _, report = run_simt(one, graph.specs, inputs, graph.weights, sources={launch.kernel: unguarded})
    found = [f for f in report.findings if f.kernel == launch.kernel]
    assert found and {f.kind for f in found} >= {"out_of_range"}
    assert any(f.buffer == "st_a" and "outside its" in f.message for f in found)
    _, report = run_simt(program, graph.specs, inputs, graph.weights)
    assert report.ok
