"""Tests for engine/runtime/simt/persistent.py: the persistent rProgram kernel of every sample under cuda-sim
(on a 2-SM A100 vDevice, so its grid stays small), and the two failures a GPU would hit that the emulator
must report: a task run by more threads than it was generated for, and a grid larger than residency."""

from __future__ import annotations

import dataclasses
import sys
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simt_samples import NAMES, assert_matches, sample  # noqa: E402

from engine.codegen.generate import generate  # noqa: E402
from engine.device import get_device  # noqa: E402
from engine.rprogram.wavefront import build_rprogram, plan_for_rprogram  # noqa: E402
from engine.runtime.simt import run_simt  # noqa: E402
from engine.runtime.simt.persistent import resident_blocks, run_persistent_simt  # noqa: E402
from engine.schedule.policies import make_plan  # noqa: E402

A100 = get_device("a100")
SMALL_A100 = dataclasses.replace(A100, name="a100-2sm", sm_count=2)

# Today's persistent kernel (engine/rprogram/persistent.py) runs every task with the kernel's largest block:
# a task generated for fewer threads lets the extra threads index past its staging tile (the gpulaunch
# branch guards each task by its own thread count; flip these once it is merged).
THREADS = ("out_of_range: {} generated for 32 threads runs{} with the persistent block's 64: the extra "
           "threads read its staging tile st_a past its end")
KNOWN = {
    "bert_layer": (THREADS.format("k00_sub_mul_matmul_add_etc", "")
                   + " (and rows of st_a never staged: uninitialized_read)"),
    "vit_block": THREADS.format("k00_norm_sub_normalize_matmul_etc", " (and k02)"),
    "conv_bn_relu": THREADS.format("k01_conv_batchnorm_relu", " (and k02, k03)"),
    "nerf_mlp": THREADS.format("k00_matmul_add_relu_concat", ""),
    "lstm": ("race: as in the ordinary lstm program, tasks over overlapping SHARED regions each store them "
             "to global memory (y::d0.t0.hr, y::d0.tN.h): unordered writes of the same values"),
}


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
    outs, report = run_persistent_simt(program, rp, graph, inputs, device=SMALL_A100)
    assert_matches(outs, want)
    assert report.ok, "\n".join(report.summary_lines())


def test_a_grid_larger_than_residency_deadlocks() -> None:
    graph, program, rp, inputs, want = _persistent("layernorm_residual")
    grid = rp.vdevice.veus
    assert resident_blocks(SMALL_A100, max(k.threads for k in program.kernels), 0) >= grid
    outs, report = run_persistent_simt(program, rp, graph, inputs, device=SMALL_A100)
    assert report.ok
    assert_matches(outs, want)
    # One wave fewer than the grid: a resident block spins on a dependency only a waiting block computes.
    _, report = run_persistent_simt(program, rp, graph, inputs, resident=grid // 2)
    (f,) = report.findings
    assert f.kind == "deadlock" and "atomicAdd(&done[" in f.source
    assert f"{grid - grid // 2} block(s) not resident" in f.message and report.stopped


def test_a_task_run_by_more_threads_than_generated_reads_past_its_shared_buffer() -> None:
    # The mechanism of today's persistent kernel, built on purpose: a tiled GEMM kernel generated for
    # fewer threads than the block it is launched with.
    graph, inputs, _ = sample("nerf_mlp")
    plan = make_plan(graph, "unfused", A100)
    program = generate(plan, graph, A100)
    i, launch = next((i, ln) for i, ln in enumerate(program.launches)
                     if program.kernel(ln.kernel).gemms and ln.block < 256)
    wide = dataclasses.replace(launch, block=256)
    one = dataclasses.replace(program, launches=program.launches[:i] + (wide,) + program.launches[i + 1:])
    _, report = run_simt(one, graph.specs, inputs, graph.weights)
    found = [f for f in report.findings if f.kernel == launch.kernel]
    assert found and {f.kind for f in found} >= {"out_of_range"}
    assert any(f.buffer == "st_a" and "outside its" in f.message for f in found)
    _, report = run_simt(program, graph.specs, inputs, graph.weights)
    assert report.ok
