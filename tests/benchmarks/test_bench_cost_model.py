"""The policy-ranking comparison of benchmarks/bench_cost_model.py: which pairs of policies count as tied
(the same program, or measured within the run's own noise) and how agreement is scored, strict and up to
ties."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_cost_model as bcm  # noqa: E402

from engine.schedule import measure  # noqa: E402


def _cell(source: str, kernels: list[list[float]], modeled: list[float]) -> dict:
    return {"source_sha": source, "kernels": [
        {"name": f"k{i}", "modeled_us": m, "measured_us": float(np.median(s)), "samples_us": list(s)}
        for i, (s, m) in enumerate(zip(kernels, modeled))]}


def _rounds(rng, center: float, spread: float, n: int = 9) -> list[float]:
    """n random rounds over [center, center + spread)."""
    return [float(x) for x in center + spread * rng.random(n)]


def test_program_rounds_sum_each_kernels_launch_of_that_round():
    rng = np.random.default_rng(1)
    a, b = _rounds(rng, 10.0, 1.0), _rounds(rng, 30.0, 2.0)
    rounds = bcm.program_rounds(_cell("x", [a, b], [1.0, 1.0]))
    assert np.allclose(rounds, np.add(a, b))
    assert bcm.program_rounds({"kernels": [{"samples_us": a}, {"measured_us": 3.0}]}) == []


def test_spans_from_fastest_to_median_decide_a_measured_tie():
    rng = np.random.default_rng(2)
    fast = _rounds(rng, 100.0, 4.0)
    assert bcm.measured_tie(fast, _rounds(rng, 100.0, 4.0))
    assert not bcm.measured_tie(fast, _rounds(rng, 120.0, 4.0))
    # one slow round (another process's time slice) does not tie a clearly faster program with it
    slow = _rounds(rng, 120.0, 4.0)
    assert not bcm.measured_tie(fast[:-1] + [150.0], slow)
    assert not bcm.measured_tie([], slow) and not bcm.measured_tie(fast, [])


def test_same_program_is_tied_and_not_ranked():
    """welder's plan is the stitch plan (same C source): the model may put either first, measurement
    too; their order counts neither way. A pair the model separates and measurement does not overlap
    still has to agree."""
    rng = np.random.default_rng(3)
    k = [_rounds(rng, 50.0, 1.0), _rounds(rng, 20.0, 1.0)]
    slower = [_rounds(rng, 90.0, 1.0), _rounds(rng, 40.0, 1.0)]
    cells = {"stitch": _cell("same", k, [40.0, 20.0]), "welder": _cell("same", [list(np.add(x, 1.5)) for x in k],
                                                                     [40.0, 20.0]),
             "unfused": _cell("other", slower, [80.0, 45.0])}
    ties = bcm.tie_classes(cells)
    assert ties[("stitch", "welder")] == ties[("welder", "stitch")] == "program"
    assert ("stitch", "unfused") not in ties
    programs = {p: (sum(x["modeled_us"] for x in c["kernels"]), sum(x["measured_us"] for x in c["kernels"]))
                for p, c in cells.items()}
    got = bcm.rank_agreement(programs, ties)
    assert got["rank_model"][0] == "stitch" and got["rank_measured"][0] == "stitch"
    assert got["same_ranking_ties"] and got["same_best_ties"]
    # the model calls unfused the fastest: measured slower and not tied, so wrong strictly and up to ties
    cells["unfused"] = _cell("other", slower, [10.0, 5.0])
    programs["unfused"] = (15.0, programs["unfused"][1])
    got = bcm.rank_agreement(programs, bcm.tie_classes(cells))
    assert not got["same_best"] and not got["same_best_ties"] and not got["same_ranking_ties"]
    assert len(got["wrong_pairs"]) == 2


def test_a_pair_within_noise_agrees_up_to_ties_but_not_strictly():
    rng = np.random.default_rng(4)
    a = _cell("a", [_rounds(rng, 100.0, 6.0)], [90.0])
    b = _cell("b", [_rounds(rng, 101.0, 6.0)], [95.0])
    cells = {"welder": b, "stitch": a}
    ties = bcm.tie_classes(cells)
    assert ties[("stitch", "welder")] == "noise"
    stitch = float(np.median(a["kernels"][0]["samples_us"]))
    programs = {"welder": (90.0, stitch + 0.5), "stitch": (95.0, stitch)}  # welder modeled faster, measured a hair slower
    got = bcm.rank_agreement(programs, ties)
    assert not got["same_ranking"] and not got["same_best"]
    assert got["same_ranking_ties"] and got["same_best_ties"]
    assert bcm.ranking_text(got["rank_measured"], ties) == "stitch ~ welder"


def test_a_tie_band_ties_pairs_closer_than_it_only_when_asked():
    """--tie-band R: programs whose measured medians are within a factor R are tied ("placement": one program
    on other buffers measured up to 1.12x apart on this VM); off by default. Tight rounds 6 % apart are not
    a noise tie."""
    rng = np.random.default_rng(6)
    a = _cell("a", [_rounds(rng, 100.0, 1.0)], [90.0])
    b = _cell("b", [_rounds(rng, 106.0, 1.0)], [80.0])
    c = _cell("c", [_rounds(rng, 130.0, 1.0)], [70.0])
    cells = {"stitch": a, "welder": b, "unfused": c}
    assert bcm.tie_classes(cells) == {}
    ties = bcm.tie_classes(cells, 1.10)
    assert ties[("stitch", "welder")] == ties[("welder", "stitch")] == "placement"
    assert ("stitch", "unfused") not in ties and ("welder", "unfused") not in ties
    got = bcm.summarize("m", cells, 1.10)
    assert sorted(tuple(x) for x in got["wrong_pairs"]) == [("unfused", "stitch"), ("unfused", "welder")]
    assert bcm.ranking_text(["stitch", "welder", "unfused"], ties) == "stitch ≈ welder < unfused"


def test_the_gpu_steps_prepare_then_time_each_kernel_alone_and_the_program_back_to_back(tmp_path, monkeypatch):
    # The GPU path of this script runs only on a lent GPU, where a failure costs the lease: its prepare step
    # (plan + NVRTC) and its timing step, here against the stand-in driver (tests/fake_cuda.py, which defines
    # only functions cuda.bindings.driver has; 0.25 ms per event pair).
    from fake_cuda import FakeDriver

    from engine.runtime import cuda_driver
    from engine.runtime.cuda_launch import open_gpu

    model = Path(__file__).resolve().parents[2] / "samples" / "layernorm_residual.onnx"
    job = {"model": str(model), "policies": ["stitch", "welder"], "device": "a100", "runs": 3,
           "store": str(tmp_path / "layernorm_residual.pkl")}
    summary = bcm.prepare(job)
    assert set(summary) == {"stitch", "welder"} and Path(job["store"]).exists()
    monkeypatch.setattr(cuda_driver, "attached_gpu", lambda: open_gpu(FakeDriver(device="a100"), 0, 13000))
    cells = bcm.time_on_gpu(job)
    assert set(cells) == {"stitch", "welder"}
    for cell in cells.values():
        assert cell["program_us"] == 250.0 and cell["kernels"]
        assert all(k["measured_us"] == 250.0 and k["grid"] >= 1 for k in cell["kernels"])
        assert isinstance(cell["max_rel_err"], float)
    assert cells["stitch"]["source_sha"] != cells["welder"]["source_sha"]


def test_whole_programs_are_timed_in_interleaved_rotated_rounds(monkeypatch):
    """`time_programs` (engine/schedule/measure.py, which the bench calls): one untimed round, then every round runs each policy's program once, the order
    rotated by one each round (load that drifts over the run falls on every policy alike); a round's time
    is the whole program's, all its launches in order."""
    ran, now = [], [0]
    monkeypatch.setattr(measure.time, "perf_counter_ns", lambda: now[0])

    def launch(policy: str, kernel: int, ns: int):
        def call():
            ran.append((policy, kernel))
            now[0] += ns
        return call

    programs = {"unfused": [launch("unfused", 0, 3000), launch("unfused", 1, 4000)],
                "stitch": [launch("stitch", 0, 5000)], "welder": [launch("welder", 0, 2000)]}
    got = measure.time_programs(programs, 4, "wall", settle_s=0)
    assert got == {"unfused": [7.0] * 4, "stitch": [5.0] * 4, "welder": [2.0] * 4}
    firsts = [p for p, k in ran if k == 0]
    assert [firsts[i:i + 3] for i in range(0, 15, 3)] == [
        ["unfused", "stitch", "welder"], ["stitch", "welder", "unfused"], ["welder", "unfused", "stitch"],
        ["unfused", "stitch", "welder"], ["stitch", "welder", "unfused"]]
    assert ran[:2] == [("unfused", 0), ("unfused", 1)]  # a program's launches in order


def test_each_timed_program_runs_untimed_first_until_the_other_pools_sleep(monkeypatch):
    """Before each timed run a program runs untimed, back to back, for `settle_s` of wall clock (at least
    once): the previous program's library's thread pool is asleep by then and this one's awake, as in a
    process running that program alone (SETTLE_S outlasts the pool's spin and yield). The timed runs and the
    rotation are as without it."""
    assert measure.SETTLE_S * 1e6 > 2000  # TW_POOL_YIELD_US of the C header
    assert "#define TW_POOL_YIELD_US 2000" in __import__("engine.codegen.targets", fromlist=["C_HEADER"]).C_HEADER
    ran, now = [], [0]
    monkeypatch.setattr(measure.time, "perf_counter_ns", lambda: now[0])

    def launch(policy: str, ns: int):
        def call():
            ran.append(policy)
            now[0] += ns
        return call

    programs = {"stitch": [launch("stitch", 3000)], "welder": [launch("welder", 4000)]}
    got = measure.time_programs(programs, 3, "wall", settle_s=10e-6)
    assert got == {"stitch": [3.0] * 3, "welder": [4.0] * 3}
    # per (round, program): ceil(10 / 3) = 4 untimed stitch runs or ceil(10 / 4) = 3 welder runs, then the timed one
    blocks = [("stitch", 5), ("welder", 4), ("welder", 4), ("stitch", 5), ("stitch", 5), ("welder", 4),
              ("welder", 4), ("stitch", 5)]
    assert ran == [p for p, n in blocks for _ in range(n)]


def test_the_ranking_takes_whole_program_rounds_where_they_were_timed():
    """Kernels summed say welder is slower (its long kernels timed alone read high); the whole programs,
    timed in rounds, say it is faster: the measured program time, the ranking and the ties come from the
    rounds. A cell without rounds (a GPU run) keeps the kernels' sums."""
    rng = np.random.default_rng(5)
    welder = _cell("w", [_rounds(rng, 60.0, 1.0), _rounds(rng, 60.0, 1.0)], [50.0, 50.0])
    stitch = _cell("s", [_rounds(rng, 50.0, 1.0), _rounds(rng, 50.0, 1.0)], [55.0, 55.0])
    assert bcm.summarize("m", {"welder": welder, "stitch": stitch})["rank_measured"] == ["stitch", "welder"]
    welder["program_samples_us"] = _rounds(rng, 90.0, 2.0, 21)
    stitch["program_samples_us"] = _rounds(rng, 100.0, 2.0, 21)
    got = bcm.summarize("m", {"welder": welder, "stitch": stitch})
    assert got["rank_measured"] == ["welder", "stitch"] and got["same_ranking"]
    assert got["programs"]["welder"][1] == float(np.median(welder["program_samples_us"]))
    assert got["kernel_sums"]["welder"] > got["kernel_sums"]["stitch"]
    assert bcm.program_rounds(welder) == welder["program_samples_us"]
