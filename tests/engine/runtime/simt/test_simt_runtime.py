"""The emulator's own tests (engine/runtime/simt/runtime.cpp + include/tw_simt.h): hand-written kernels, each
correct one with zero findings and the right values, each deliberately broken one caught with its kind and
printed line."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import simt_kernels as K  # noqa: E402

from engine.runtime.simt.driver import run_cuda_source  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _kinds(report) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for f in report.findings:
        out.setdefault(f.kind, []).append(f.line)
    return out


def test_reverse_with_barrier_is_clean_and_correct(rng) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    (_, y), report = run_cuda_source(K.REVERSE, "reverse", [(x, "in"), (np.empty(128, np.float32), "out")],
                                     grid=2, block=64, shared_bytes=256)
    assert report.ok, report.summary_lines()
    np.testing.assert_array_equal(y, x.reshape(2, 64)[:, ::-1].ravel())
    k = report.kernels[0]
    assert (k.global_load_bytes, k.global_store_bytes) == (512, 512)
    assert (k.shared_load_bytes, k.shared_store_bytes) == (512, 512)


def test_removed_barrier_is_a_race(rng) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    _, report = run_cuda_source(K.REVERSE_NO_BARRIER, "reverse", [(x, "in"), (np.empty(128, np.float32), "out")],
                                grid=2, block=64, shared_bytes=256)
    found = _kinds(report)
    # Threads run in order, so thread 0 reads s[63] before thread 63 writes it (never written), and thread
    # 63's write then races with that read: both at the lines that lost their barrier.
    assert K.bad_line(K.REVERSE_NO_BARRIER, "WRITE") in found["race"]
    assert K.bad_line(K.REVERSE_NO_BARRIER, "READ") in found["uninitialized_read"]
    race = next(f for f in report.findings if f.kind == "race")
    assert race.buffer == "shared memory" and "no __syncthreads between" in race.message


def test_off_by_one_tail_is_out_of_range(rng) -> None:
    x = rng.standard_normal(100).astype(np.float32)
    y = np.empty(100, np.float32)
    _, report = run_cuda_source(K.SCALE_TAIL, "scale", [(x, "in"), (y, "out")], grid=2, block=64)
    assert report.ok
    np.testing.assert_array_equal(y, 2.0 * x)
    _, report = run_cuda_source(K.SCALE_OFF_BY_ONE, "scale", [(x, "in"), (y, "out")], grid=2, block=64)
    assert set(_kinds(report)) == {"out_of_range"}
    bad = {(f.buffer, f.line, f.thread, f.block) for f in report.findings}
    assert bad == {(name, K.bad_line(K.SCALE_OFF_BY_ONE), (36, 0, 0), (1, 0, 0)) for name in ("x", "y")}
    assert "x[100] outside its 100 elements" in " ".join(f.message for f in report.findings)


def test_missing_grid_sync_is_a_race_across_blocks(rng) -> None:
    x = rng.standard_normal(256).astype(np.float32)
    args = lambda: [(x, "in"), (np.empty(256, np.float32), "out"), (np.empty(256, np.float32), "out")]  # noqa: E731
    (_, _, y), report = run_cuda_source(K.ROTATE, "rotate", args(), grid=4, block=32, cooperative=True)
    assert report.ok, report.summary_lines()
    np.testing.assert_array_equal(y, np.roll(2.0 * x, -32))
    _, report = run_cuda_source(K.ROTATE_NO_GRID_SYNC, "rotate", args(), grid=4, block=32, cooperative=True)
    races = [f for f in report.findings if f.kind == "race" and f.line == K.bad_line(K.ROTATE_NO_GRID_SYNC)]
    assert races and "another block, no grid sync" in races[0].message


def test_barrier_in_divergent_code_is_partial(rng) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    _, report = run_cuda_source(K.DIVERGENT_BARRIER, "halves", [(x, "in"), (np.empty(64, np.float32), "out")],
                                grid=1, block=64, shared_bytes=256)
    found = [f for f in report.findings if f.kind == "partial_barrier"]
    assert found[0].line == K.bad_line(K.DIVERGENT_BARRIER)
    assert "16 threads" in found[0].message and "divergent" in found[0].message
    # released together (as bar.sync counts arrivals), the first 16 then meet the second barrier alone
    assert [f.line for f in found[1:]] == [K.bad_line(K.DIVERGENT_BARRIER) + 2]


def test_barrier_after_early_exit_is_partial(rng) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    (_, y), report = run_cuda_source(K.EARLY_EXIT_BARRIER, "early", [(x, "in"), (np.zeros(64, np.float32), "inout")],
                                     grid=1, block=64, shared_bytes=256)
    assert [(f.kind, f.line) for f in report.findings] == [("partial_barrier", K.bad_line(K.EARLY_EXIT_BARRIER))]
    assert "60 of 64 threads" in report.findings[0].message
    np.testing.assert_array_equal(y[:60], x[:60][::-1])


def test_full_warp_shuffle_is_clean_and_correct(rng) -> None:
    x = rng.standard_normal(96).astype(np.float32)
    (_, y), report = run_cuda_source(K.WARP_SUM, "warp_sum", [(x, "in"), (np.empty(3, np.float32), "out")],
                                     grid=1, block=96)
    assert report.ok
    np.testing.assert_allclose(y, x.reshape(3, 32).sum(1), rtol=1e-5)


def test_shuffle_with_lanes_missing_from_its_mask(rng) -> None:
    x = rng.standard_normal(32).astype(np.float32)
    _, report = run_cuda_source(K.PARTIAL_SHUFFLE, "half_warp", [(x, "in"), (np.empty(32, np.float32), "out")],
                                grid=1, block=32)
    found = [f for f in report.findings if f.kind == "partial_shuffle"]
    assert found and {f.line for f in found} == {K.bad_line(K.PARTIAL_SHUFFLE)}
    assert any("exited" in f.message for f in found)


def test_read_of_never_written_output(rng) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    _, report = run_cuda_source(K.UNWRITTEN_OUTPUT, "accumulate", [(x, "in"), (np.empty(64, np.float32), "out")],
                                grid=1, block=64)
    assert [(f.kind, f.line, f.buffer, f.count) for f in report.findings] == [
        ("uninitialized_read", K.bad_line(K.UNWRITTEN_OUTPUT), "y", 64)]
    # the same kernel on an initialised buffer is fine
    (_, y), report = run_cuda_source(K.UNWRITTEN_OUTPUT, "accumulate", [(x, "in"), (np.ones(64, np.float32), "inout")],
                                     grid=1, block=64)
    assert report.ok
    np.testing.assert_array_equal(y, x + 1.0)


def _handoff(source: str, resident: int):
    y = np.zeros(64, np.float32)
    flag = np.zeros(1, np.uint32)
    return run_cuda_source(source, "handoff", [(y, "inout"), (flag, "inout")], grid=2, block=32,
                           resident=resident)


def test_spin_wait_with_both_blocks_resident_is_clean() -> None:
    (y, flag), report = _handoff(K.HANDOFF, resident=2)
    assert report.ok, report.summary_lines()
    np.testing.assert_array_equal(y[:32], 2.0 * np.arange(32) + 1.0)
    assert flag[0] == 1


def test_spin_wait_on_a_block_that_is_not_resident_is_a_deadlock() -> None:
    _, report = _handoff(K.HANDOFF, resident=1)
    assert [(f.kind, f.line) for f in report.findings] == [("deadlock", K.bad_line(K.HANDOFF, "SPIN"))]
    assert "1 block(s) not resident" in report.findings[0].message
    assert report.stopped


def test_spin_wait_without_the_acquiring_fence_is_a_race() -> None:
    _, report = _handoff(K.HANDOFF_NO_ACQUIRE, resident=2)
    assert {(f.kind, f.line) for f in report.findings} == {("race", K.bad_line(K.HANDOFF_NO_ACQUIRE, "READ"))}


def test_half_precision_and_math_builtins(rng) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    (_, h, y), report = run_cuda_source(
        K.HALF_ROUND_TRIP, "halves_out",
        [(x, "in"), (np.empty(64, np.float16), "out"), (np.empty(64, np.float32), "out")], grid=2, block=32,
    )
    assert report.ok
    np.testing.assert_array_equal(h, x.astype(np.float16))
    np.testing.assert_allclose(y, x.astype(np.float16).astype(np.float32) + 1 / np.sqrt(np.abs(x) + 1), rtol=1e-6)


def test_named_barrier_of_a_task_is_clean_and_correct(rng) -> None:
    x = rng.standard_normal(256).astype(np.float32)
    (_, y), report = run_cuda_source(K.NAMED_TASK, "task", [(x, "in"), (np.empty(256, np.float32), "out")],
                                     grid=2, block=128, shared_bytes=512)
    assert report.ok, report.summary_lines()
    rows = x.reshape(2, 128)[:, 63::-1]
    want = np.concatenate([rows * x.reshape(2, 128)[:, :1], 2.0 * rows], axis=1)
    np.testing.assert_array_equal(y, want.ravel())
    # the same kernel without the barrier that orders the task's reads before its rewrite: a race
    _, report = run_cuda_source(K.NAMED_TASK.replace("        __barrier_sync_count(1, 64);\n        s[", "        s["),
                                "task", [(x, "in"), (np.empty(256, np.float32), "out")], grid=2, block=128,
                                shared_bytes=512)
    assert {f.kind for f in report.findings} == {"race"}


def test_named_barrier_orders_only_the_threads_it_counts(rng) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    _, report = run_cuda_source(K.NAMED_LEAVES_OUT, "leave_out", [(x, "in"), (np.empty(128, np.float32), "out")],
                                grid=1, block=128, shared_bytes=512)
    assert [(f.kind, f.line, f.buffer) for f in report.findings] == [
        ("race", K.bad_line(K.NAMED_LEAVES_OUT), "shared memory")]
    assert "nor a named barrier counting both" in report.findings[0].message
    assert f"at line {K.bad_line(K.NAMED_LEAVES_OUT, 'WRITE')}" in report.findings[0].message
    # s[0] read by every thread (the task's 64 too), then rewritten after a barrier of the task's threads
    _, report = run_cuda_source(K.NAMED_SHARED_READ, "shared_read", [(x, "in"), (np.empty(128, np.float32), "out")],
                                grid=1, block=128, shared_bytes=512)
    assert [(f.kind, f.line) for f in report.findings] == [("race", K.bad_line(K.NAMED_SHARED_READ))]
    assert "several threads of block 0" in report.findings[0].message


@pytest.mark.parametrize("source,fragment", [
    (K.NAMED_OUTSIDER, "thread 64 of block 0 reaches named barrier 1 at line 4, which counts threads 0..63 only"),
    (K.NAMED_COUNTS_DISAGREE, "thread 32 passes 96 threads at line 4, the threads waiting at line 4 passed 64"),
    (K.NAMED_PART_WARP, "counts 48 threads: whole warps"),
])
def test_named_barrier_misused_is_partial(rng, source: str, fragment: str) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    (_, y), report = run_cuda_source(source, "misuse", [(x, "in"), (np.empty(128, np.float32), "out")],
                                     grid=1, block=128)
    assert [(f.kind, f.line) for f in report.findings] == [("partial_barrier", K.bad_line(source))]
    assert fragment in report.findings[0].message and not report.stopped
    np.testing.assert_array_equal(y, x)


def test_named_barrier_after_early_exit_is_partial(rng) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    (_, y), report = run_cuda_source(K.NAMED_EARLY_EXIT, "early", [(x, "in"), (np.zeros(128, np.float32), "inout")],
                                     grid=1, block=128, shared_bytes=512)
    assert [(f.kind, f.line) for f in report.findings] == [("partial_barrier", K.bad_line(K.NAMED_EARLY_EXIT))]
    assert "reached by 60 of its 64 threads of block 0; 4 exited before it" in report.findings[0].message
    np.testing.assert_array_equal(y[:60], x[:60][::-1])


def test_named_barrier_that_never_completes_stops_the_launch(rng) -> None:
    x = rng.standard_normal(128).astype(np.float32)
    _, report = run_cuda_source(K.NAMED_NEVER_COMPLETES, "stuck", [(x, "in"), (np.empty(128, np.float32), "out")],
                                grid=1, block=128)
    line = K.bad_line(K.NAMED_NEVER_COMPLETES)
    assert [(f.kind, f.line) for f in report.findings] == [("partial_barrier", line)] and report.stopped
    message = report.findings[0].message
    assert f"32 at a named barrier line {line}" in message and f"96 at __syncthreads line {line + 1}" in message


def test_float4_loads_and_stores_are_checked_and_counted(rng) -> None:
    x = rng.standard_normal(512).astype(np.float32)
    (_, y), report = run_cuda_source(K.COPY4, "copy4", [(x, "in"), (np.empty(512, np.float32), "out")],
                                     grid=2, block=64, shared_bytes=1024)
    assert report.ok, report.summary_lines()
    np.testing.assert_array_equal(y, x.reshape(-1, 4)[:, ::-1].ravel())
    k = report.kernels[0]
    assert (k.global_load_bytes, k.global_store_bytes, k.shared_load_bytes) == (2048, 2048, 2048)


def test_misaligned_float4_load_is_reported(rng) -> None:
    x = rng.standard_normal(520).astype(np.float32)
    _, report = run_cuda_source(K.COPY4_MISALIGNED, "copy4", [(x, "in"), (np.empty(512, np.float32), "out")],
                                grid=2, block=64, shared_bytes=1024)
    found = _kinds(report)
    assert set(found) == {"misaligned"} and found["misaligned"] == [K.bad_line(K.COPY4_MISALIGNED, "BAD")]
    assert "16-byte read of x at byte 4, not 16-byte aligned" in report.findings[0].message
