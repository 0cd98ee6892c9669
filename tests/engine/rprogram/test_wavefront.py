"""Tests for engine/rprogram/wavefront.py: placement rules, variants, wave merging, makespan."""

from __future__ import annotations

import dataclasses

import pytest
from rprogram_plans import kernel, lstm_like_plan, make_plan, random_plan

from engine.device import get_device
from engine.rprogram.model import RProgramError
from engine.rprogram.wavefront import bfs_waves, build_rprogram, check_rprogram
from engine.schedule.plan import Tile

A100 = get_device("a100")


@pytest.mark.parametrize("seed", range(8))
def test_random_dags_obey_placement_rules(seed: int) -> None:
    plan = random_plan(seed)
    rp = build_rprogram(plan, A100)
    assert check_rprogram(rp) == []
    # Every rTask of a dependent kernel starts after every rTask of its inputs ends.
    ends = {op.name: max(t.end_us for ts in rp.veus for t in ts if t.op == op.name) for op in rp.operators}
    for op in rp.operators:
        starts = [t.start_us for ts in rp.veus for t in ts if t.op == op.name]
        assert all(s >= ends[d] - 1e-9 for d in op.deps for s in starts)
    assert 0 < rp.utilization <= 1


def test_check_rprogram_reports_overlap_and_dependency_violations() -> None:
    rp = build_rprogram(make_plan([kernel("a", 2), kernel("b", 2, deps=("a",))]), A100)
    veus = [list(ts) for ts in rp.veus]
    v = next(i for i, ts in enumerate(veus) if any(t.op == "b" for t in ts))
    k = next(j for j, t in enumerate(veus[v]) if t.op == "b")
    veus[v][k] = dataclasses.replace(veus[v][k], start_us=0.0)  # b before a ends
    bad = dataclasses.replace(rp, veus=tuple(tuple(ts) for ts in veus))
    problems = check_rprogram(bad)
    assert any("before its input a ends" in p for p in problems)
    same = [list(ts) for ts in rp.veus]
    same[0] = sorted(same[0] + [dataclasses.replace(same[0][0], block=99)], key=lambda t: t.start_us)
    assert any("starts at" in p and "vEU 0" in p for p in check_rprogram(
        dataclasses.replace(rp, veus=tuple(tuple(ts) for ts in same))))


def test_independent_small_kernels_run_side_by_side() -> None:
    rp = build_rprogram(make_plan([kernel("a", 10, us=7.0), kernel("b", 20, us=3.0)]), A100)
    starts = {t.op: t.start_us for ts in rp.veus for t in ts}
    assert starts == {"a": 0.0, "b": 0.0}
    assert rp.span_us == pytest.approx(7.0)
    assert rp.sequential_us == pytest.approx(7.0 + 3.0 + 2 * 5.0)
    assert rp.makespan_us == pytest.approx(7.0 + 5.0)


def test_vdevice_slots_follow_the_largest_block() -> None:
    rp = build_rprogram(make_plan([kernel("a", 4, threads=1024), kernel("b", 4, threads=128)]), A100)
    assert rp.vdevice.slots == 2 and rp.vdevice.limiter == "threads"
    assert rp.vdevice.veus == 2 * A100.sm_count
    big = make_plan([kernel("a", 4, shared=100 * 1024)])
    assert build_rprogram(big, A100).vdevice.slots == 1
    with pytest.raises(RProgramError, match="fits"):
        build_rprogram(make_plan([kernel("a", 4, shared=200 * 1024)]), A100)


def test_task_duration_is_kernel_time_per_wave_scaled_to_shared_slots() -> None:
    # Alone the kernel runs 4 blocks/SM in 2 waves for 20 us; the vDevice has only 2 slots (1024-thread
    # neighbour), so each block takes half as long and the kernel alone still takes its modeled time.
    plan = make_plan([kernel("a", 4 * 108 * 2, us=20.0, waves=2, resident=4), kernel("b", 1, threads=1024)])
    rp = build_rprogram(plan, A100)
    assert rp.chosen("a").task_us == pytest.approx(20.0 / 2 * 2 / 4)
    assert max(t.end_us for ts in rp.veus for t in ts if t.op == "a") == pytest.approx(20.0)


def test_lstm_like_program_beats_sequential_by_half() -> None:
    rp = build_rprogram(lstm_like_plan(), A100)
    assert check_rprogram(rp) == []
    assert rp.makespan_us <= 0.5 * rp.sequential_us
    # The 32 projections are one wave and run together.
    assert {t.start_us for ts in rp.veus for t in ts if t.op.startswith("proj")} == {0.0}


def test_bfs_waves_and_topological_errors() -> None:
    plan = make_plan([kernel("a", 1), kernel("b", 1), kernel("c", 1, deps=("a",)), kernel("d", 1, deps=("c", "b"))])
    rp = build_rprogram(plan, A100)
    assert bfs_waves(rp.operators) == [["a", "b"], ["c"], ["d"]]
    # Group order need not be topological (plans order groups by their first stage).
    swapped = build_rprogram(dataclasses.replace(plan, groups=plan.groups[::-1]), A100)
    assert bfs_waves(swapped.operators) == [["b", "a"], ["c"], ["d"]]
    assert check_rprogram(swapped) == []
    cyclic = make_plan([kernel("a", 1, deps=("b",)), kernel("b", 1, deps=("a",))])
    with pytest.raises(RProgramError, match="cycle"):
        build_rprogram(cyclic, A100)
    nocost = dataclasses.replace(plan, groups=(dataclasses.replace(plan.groups[0], cost=None), *plan.groups[1:]))
    with pytest.raises(RProgramError, match="has no cost"):
        build_rprogram(nocost, A100)


def test_merging_small_waves_removes_barriers_and_big_waves_keep_them() -> None:
    chain = make_plan([kernel("a", 4), kernel("b", 4, deps=("a",)), kernel("c", 4, deps=("b",))])
    merged = build_rprogram(chain, A100)
    apart = build_rprogram(chain, A100, merge=False)
    assert len(merged.steps) == 1 and "merged" in merged.steps[0].reason
    assert len(apart.steps) == 3 and "merging disabled" in apart.steps[1].reason
    assert merged.makespan_us < apart.makespan_us
    assert check_rprogram(apart) == []
    # A dependent wave of many rounds would pay a counter poll on every block: a barrier wins.
    rounds = 864 * 40
    wide = make_plan([kernel("a", rounds, us=1.0), kernel("b", rounds, deps=("a",), us=1.0)])
    rp = build_rprogram(wide, A100, sync_us=0.5)
    assert len(rp.steps) == 2 and "barrier before wave 1" in rp.steps[1].reason


def test_variants_fastest_when_underfilled_efficient_when_overfilled() -> None:
    small = Tile("a", (8, 8), 256, 40)
    big = Tile("a", (64, 64), 256, 2)
    # Under-fill: 4 blocks on 864 vEUs; the 40-block candidate moves a quarter of the bytes per wave.
    under = make_plan([kernel("a", 4, candidates=((Tile("a", (16, 16), 256, 4), 4000, 1), (small, 1000, 1)))])
    rp = build_rprogram(under, A100)
    assert rp.chosen("a").blocks == 40 and "scaled" in rp.chosen("a").source
    assert "fastest" in rp.steps[0].reason
    # Over-fill: 5000 blocks; the 2-block candidate needs less vEU-time in all.
    over = make_plan([kernel("a", 5000, waves=6, candidates=((Tile("a", (16, 16), 256, 5000), 6000, 6),
                                                               (big, 60, 1)))])
    rp = build_rprogram(over, A100)
    assert rp.chosen("a").blocks == 2 and "resource-efficient" in rp.steps[0].reason
    assert check_rprogram(rp) == []


def test_measured_profile_replaces_modeled_time() -> None:
    plan = make_plan([kernel("a", 4, us=10.0), kernel("b", 4, us=10.0)])
    rp = build_rprogram(plan, A100, profile={"a": 3.0})
    assert rp.chosen("a").source == "measured" and rp.chosen("b").source == "modeled"
    assert rp.chosen("a").task_us == pytest.approx(3.0)
    assert rp.sequential_us == pytest.approx(3.0 + 10.0 + 2 * 5.0)
    with pytest.raises(RProgramError, match="per-kernel times"):
        build_rprogram(plan, A100, profile=42)


@pytest.mark.parametrize("seed", range(4))
def test_makespan_is_bounded_by_critical_path_and_total_work(seed: int) -> None:
    rp = build_rprogram(random_plan(seed), A100)
    assert rp.makespan_us >= rp.critical_path_us - 1e-9
    assert rp.span_us >= rp.busy_us / rp.vdevice.veus - 1e-9
    chain = make_plan([kernel("a", 2, us=4.0), kernel("b", 2000, deps=("a",), us=6.0, waves=3)])
    rp = build_rprogram(chain, A100)
    assert rp.critical_path_us == pytest.approx(5.0 + 4.0 + 3 * 6.0 / 3 * 1)


def test_small_grid_keeps_its_time_on_a_one_slot_vdevice() -> None:
    # 50 blocks spread one per SM: sharing the SM with nobody, each block takes the whole kernel time,
    # even though the kernel alone could hold 8 blocks per SM and the vDevice holds only 1.
    plan = make_plan([kernel("a", 50, us=9.0, resident=8), kernel("big", 1, shared=120 * 1024)])
    rp = build_rprogram(plan, A100)
    assert rp.vdevice.slots == 1
    assert rp.chosen("a").task_us == pytest.approx(9.0)
    assert rp.critical_path_us == pytest.approx(5.0 + 10.0)


def test_profile_object_gives_measured_times() -> None:
    from engine.profile.profile import KernelTime, Profile

    plan = make_plan([kernel("a", 4, us=10.0), kernel("b", 4, deps=("a",), us=10.0)])
    prof = Profile("measured on CPU (C backend)", "cpu", (KernelTime("b", 2.5, 3),))
    rp = build_rprogram(plan, A100, profile=prof)
    assert rp.chosen("b").source == "measured" and rp.chosen("b").task_us == pytest.approx(2.5)
    assert rp.chosen("a").source == "modeled"
