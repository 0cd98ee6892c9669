"""`tileweave bench` (engine/profile/bench.py, bench_worker.py): the --json contract, timeouts that
report instead of hanging, the text table, and one-line errors for bad models and policies."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import TEST_DATA, sample_path

from engine.cli import main
from engine.profile.bench import bench_models, format_bench
from engine.profile.bench_worker import bench_inputs, max_rel_error

GELU = str(sample_path("gelu_chain"))


def test_json_shape_and_numbers(capsys):
    # A GPU preset's plans: their modeled DRAM traffic never goes under the floor (weights, inputs and
    # outputs moved once). The host's (the default) counts no DRAM traffic for a model its last-level
    # cache holds, run after run.
    assert main(["bench", GELU, "--policy", "elementwise", "--policy", "unfused", "--runs", "4", "--json",
                 "--device", "a100"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["device"] == "a100"
    assert {"cpu", "cores", "threads", "onnxruntime"} <= result["machine"].keys()
    [model] = result["models"]
    assert model["name"] == "gelu_chain" and model["ort_ms"] > 0
    assert list(model["policies"]) == ["elementwise", "unfused"]
    for policy, cell in model["policies"].items():
        assert not cell["timeout"] and "error" not in cell, (policy, cell)
        assert cell["ms"] > 0 and cell["ratio"] == pytest.approx(cell["ms"] / model["ort_ms"])
        assert cell["max_rel_err"] <= 1e-4
        assert cell["modeled_us"] > 0 and cell["schedule_s"] >= 0
        assert cell["dram_bytes"] >= model["min_dram_bytes"] > 0
        assert 0 < cell["ms_q1"] <= cell["ms"] <= cell["ms_q3"]  # the run's own spread, around the median
    # elementwise fuses the whole chain into one kernel; unfused keeps one per ONNX node.
    assert model["policies"]["elementwise"]["kernels"] == 1 < model["policies"]["unfused"]["kernels"]
    # Both timed in the same rounds: the slower one against the faster, round by round.
    slow, fast = sorted(model["policies"], key=lambda p: -model["policies"][p]["ms"])
    vs = model["policies"][slow]["vs_fastest"]
    assert vs["policy"] == fast and vs["lo"] <= vs["ratio"] <= vs["hi"] and "vs_fastest" not in model["policies"][fast]
    assert len(model["ort_ms_samples"]) == len(model["policies"][slow]["ms_samples"]) == 4


def test_default_device_is_host_and_tuned_cells_run_beside_plain_ones(capsys):
    assert main(["bench", GELU, "--policy", "unfused", "--policy", "unfused+tune", "--tune", "2", "--runs", "2",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["device"] == "host"
    cells = result["models"][0]["policies"]
    assert list(cells) == ["unfused", "unfused+tune"]
    for cell in cells.values():
        assert not cell["timeout"] and "error" not in cell, cell
        assert cell["ms"] > 0 and cell["max_rel_err"] <= 1e-4
    # Tuning picks tiles, not fusion, for unfused: one kernel per node either way.
    assert cells["unfused+tune"]["kernels"] == cells["unfused"]["kernels"]


def test_a_cell_past_its_timeout_is_killed_and_reported():
    # No Python process imports numpy, onnxruntime and the engine in 50 ms: the worker is always killed.
    result = bench_models([GELU], ["welder"], runs=1, timeout=0.05)
    cell = result["models"][0]["policies"]["welder"]
    assert cell["timeout"] and cell["ms"] is None and cell["ratio"] is None
    assert cell["phase"] in ("start", "import")
    assert "timeout (" in format_bench(result)


def test_shape_binds_dynamic_dimensions(capsys):
    mlp = str(TEST_DATA / "torch" / "mlp_ln_gelu.onnx")  # dynamic batch axis
    assert main(["bench", mlp, "--policy", "unfused", "--runs", "1", "--json"]) == 2
    assert "--shape" in capsys.readouterr().err
    assert main(["bench", mlp, "--shape", "x=5,32", "--policy", "unfused", "--runs", "1", "--json"]) == 0
    cell = json.loads(capsys.readouterr().out)["models"][0]["policies"]["unfused"]
    assert cell["ms"] > 0 and cell["max_rel_err"] <= 1e-4


def test_dynamic_dimensions_bind_from_the_inputs_beside_and_shape_binds_where_dynamic(capsys, tmp_path):
    """A --shape binds the input in every model where it has a dynamic dimension (here the MLP's batch axis; the
    GELU sample's x is static and keeps its shape), a model's .io.npz binds the dimensions --shape leaves
    unbound (the arrays it is timed on), and a name no model has is one line naming each model's inputs."""
    import shutil

    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        shutil.copy(TEST_DATA / "torch" / "mlp_ln_gelu.onnx", tmp_path / sub / "mlp.onnx")  # dynamic batch axis
    assert main(["bench", str(tmp_path / "a" / "mlp.onnx"), GELU, "--shape", "x=5,32", "--policy", "unfused",
                 "--runs", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["models"]
    assert len(rows) == 2 and all(row["policies"]["unfused"]["ms"] > 0 for row in rows)
    x = np.random.default_rng(4).standard_normal((3, 32)).astype(np.float32)
    np.savez(tmp_path / "b" / "mlp.io.npz", x=x)
    assert main(["bench", str(tmp_path / "b" / "mlp.onnx"), "--policy", "unfused", "--runs", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"][0]["policies"]["unfused"]["max_rel_err"] <= 1e-4
    assert main(["bench", str(tmp_path / "a" / "mlp.onnx"), GELU, "--shape", "nope=1", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope" in err and "mlp.onnx: x" in err


def test_text_table_names_timeouts_and_errors():
    cell = {"ms": 2.0, "ratio": 4.0, "max_rel_err": 1e-6, "kernels": 3, "modeled_us": 12.5, "schedule_s": 0.1,
            "timeout": False}
    result = {"machine": {"cpu": "cpu", "cores": 2, "threads": 2, "onnxruntime": "1", "load_average": [0.1]},
              "device": "a100", "runs": 5, "timeout_s": 60.0,
              "models": [{"name": "m", "ort_ms": 0.5, "policies": {
                  "unfused": cell,
                  "welder": {**cell, "ms": None, "ratio": None, "timeout": True, "phase": "time"},
                  "stitch": {**cell, "ms": None, "ratio": None, "error": "PlanError: too big"}}}]}
    text = format_bench(result)
    assert "4.00x" in text and "timeout (time)" in text
    assert "m stitch: PlanError: too big" in text
    assert "spread" in text and "±" not in text  # no quartiles given: no spread claimed
    result["models"][0]["policies"]["unfused"].update(ms_q1=1.9, ms_q3=2.1)
    assert "±5%" in format_bench(result)  # half the interquartile range over the median
    assert "fastest" not in format_bench(result).split("vs fastest")[1].split("\n\n")[0]  # nothing paired
    result["models"][0]["policies"]["stitch"] = {**cell, "ms": 2.5, "vs_fastest": {
        "policy": "unfused", "ratio": 1.25, "lo": 1.1, "hi": 1.3}}
    text = format_bench(result)
    assert "1.25x [1.10-1.30]" in text and " fastest " in text


def test_policies_printing_the_same_c_are_one_program():
    """Two policies whose plans print the same C source are one program: no ratio between them (what they
    differ by is where their buffers landed), each names the other, and the table says so."""
    from engine.profile.bench import _model_row

    cells = {p: {"kernels": 1, "max_rel_err": 1e-7} for p in ("elementwise", "unfused", "welder")}
    timed = {"samples": {"onnxruntime": [0.5] * 4, "elementwise": [0.22, 0.23, 0.22, 0.23],
                         "unfused": [0.6, 0.61, 0.6, 0.62], "welder": [0.2, 0.21, 0.2, 0.21]},
             "sources": {"elementwise": "aa", "unfused": "bb", "welder": "aa"}}
    row = _model_row("m.onnx", cells, set(cells), timed)
    pol = row["policies"]
    assert pol["elementwise"]["same_program_as"] == ["welder"] and pol["welder"]["same_program_as"] == ["elementwise"]
    assert "vs_fastest" not in pol["elementwise"] and "same_program_as" not in pol["unfused"]
    assert pol["unfused"]["vs_fastest"]["policy"] == "welder" and pol["unfused"]["vs_fastest"]["ratio"] > 2.8
    text = format_bench({"machine": {"cpu": "c", "cores": 2, "threads": 2, "onnxruntime": "1", "load_average": None},
                         "device": "host", "runs": 4, "timeout_s": 9.0, "models": [row]})
    assert "= welder" in text and "= elementwise" in text


def test_paired_ratio_reads_round_by_round():
    from engine.profile.bench import paired_ratio

    # A slow phase that hits both sides of a round cancels in their ratio.
    ours = [1.1, 1.1, 2.2, 1.1, 2.2, 1.1, 1.1, 2.2]
    other = [1.0, 1.0, 2.0, 1.0, 2.0, 1.0, 1.0, 2.0]
    med, lo, hi = paired_ratio(ours, other)
    assert med == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    rng = np.random.default_rng(5)
    noisy = list(rng.uniform(0.9, 1.1, 41))
    med, lo, hi = paired_ratio(noisy, [1.0] * 41)
    assert lo < 1.0 < hi and lo <= med <= hi
    assert paired_ratio(noisy, [1.0] * 41) == (med, lo, hi)  # a fixed seed: the same interval each time


def test_inputs_come_from_the_io_file_beside_the_model():
    from engine.api import load_graph

    graph = load_graph(GELU)
    stored = np.load(sample_path("gelu_chain").with_name("gelu_chain.io.npz"))
    inputs = bench_inputs(graph, sample_path("gelu_chain"))
    np.testing.assert_array_equal(inputs["x"], stored["x"])


def test_max_rel_error_flags_a_shape_mismatch():
    want = {"y": np.array([1.0, -2.0])}
    assert max_rel_error({"y": np.array([1.0, -1.0])}, want) == pytest.approx(0.5)
    assert max_rel_error({"y": np.array([1.0])}, want) == float("inf")


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "missing.onnx"], "model file 'missing.onnx' does not exist"),
    (["bench", GELU, "--policy", "fastest"], "unknown policy 'fastest'"),
    (["bench", GELU, "--runs", "0"], "--runs 0 must be at least 1"),
    (["bench", GELU, "--timeout", "0"], "--timeout 0 must be positive"),
    (["bench", GELU, "--device", "a101"], "a101"),
    (["bench", GELU, "--tune", "0"], "--tune 0"),
    (["bench", GELU, "--policy", "welder+tuned"], "unknown policy 'welder+tuned'"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_onnxruntime_workers_do_not_spin_beside_our_threads():
    # Interleaved with our OpenMP programs in one process, a spinning onnxruntime worker holds a core our
    # next program's team needs (decoder_kv welder, 2 threads: 1.29 ms beside it, 0.042 ms without).
    from engine.profile.bench_worker import ort_session

    key = "session.intra_op.allow_spinning"
    assert ort_session(GELU, 2).get_session_options().get_session_config_entry(key) == "0"
    with pytest.raises(Exception, match="does not have configuration"):  # one thread: onnxruntime's default
        ort_session(GELU, 1).get_session_options().get_session_config_entry(key)


def test_policies_and_onnxruntime_are_timed_in_the_same_rounds(monkeypatch, tmp_path):
    """A model's prepared plans and onnxruntime are timed in one process, in the same rounds: each round runs
    every side once, each settled first (`measure.settle`: run untimed until the other's idle threads sleep —
    onnxruntime timed right after our program shared a core with our pool's idle worker), in an order rotated
    round by round."""
    from engine.profile import bench_worker
    from engine.schedule import measure

    plans = {}
    for policy in ("elementwise", "unfused"):
        plans[policy] = tmp_path / f"{policy}.json"
        prepared = bench_worker.prepare_job({"model": GELU, "policy": policy, "device": "host", "threads": 1,
                                             "plan_out": str(plans[policy])})
        assert prepared["max_rel_err"] <= 1e-4 and prepared["kernels"] >= 1
    order: list[str] = []
    real_time, real_settle = measure.time_programs, measure.settle

    def timing(programs, rounds, *args, **kwargs):
        wrapped = {name: [lambda name=name, calls=calls: (order.append(name), [c() for c in calls])]
                   for name, calls in programs.items()}
        return real_time(wrapped, rounds, *args, **kwargs)

    def settling(calls, seconds=measure.SETTLE_S):
        assert seconds == measure.SETTLE_S
        real_settle(calls, 0.0)  # run once (the real function: at least once), without the 2.5 ms
    monkeypatch.setattr(measure, "time_programs", timing)
    monkeypatch.setattr(measure, "settle", settling)
    result = bench_worker.time_job({"mode": "time", "model": GELU, "device": "host", "runs": 3, "threads": 1,
                                    "plans": {p: str(path) for p, path in plans.items()}})
    samples = result["samples"]
    assert set(samples) == {bench_worker.ORT, "elementwise", "unfused"}
    assert all(len(ts) == 3 and min(ts) > 0 for ts in samples.values())
    # One untimed round and three timed ones, each side settled (run once here) then run: the order rotates
    # by one each round, so no side always follows the same one.
    assert len(order) == 4 * 3 * 2 and order[0::2] == order[1::2]
    assert len({order[k] for k in range(0, len(order), 6)}) == 3


def test_a_plan_that_fails_in_the_timing_run_fails_alone(tmp_path):
    from engine.profile import bench_worker
    from engine.profile.bench import _model_row

    good = tmp_path / "good.json"
    bench_worker.prepare_job({"model": GELU, "policy": "elementwise", "device": "host", "threads": 1,
                              "plan_out": str(good)})
    (tmp_path / "bad.json").write_text("{not json")
    plans = {"elementwise": str(good), "unfused": str(tmp_path / "bad.json")}
    timed = bench_worker.time_job({"mode": "time", "model": GELU, "device": "host", "runs": 2, "threads": 1,
                                   "plans": plans})
    assert len(timed["samples"]["elementwise"]) == 2 and "unfused" not in timed["samples"]
    assert timed["errors"]["unfused"].startswith("PlanError when timing: ") and "not valid JSON" in timed["errors"]["unfused"]
    row = _model_row(GELU, {"elementwise": {"kernels": 1}, "unfused": {"kernels": 10}}, set(plans), timed)
    assert row["policies"]["elementwise"]["ms"] > 0 and "error" not in row["policies"]["elementwise"]
    assert row["policies"]["unfused"]["ms"] is None and "not valid JSON" in row["policies"]["unfused"]["error"]


def test_a_failed_timing_run_marks_the_prepared_cells(monkeypatch):
    from engine.profile import bench

    monkeypatch.setattr(bench, "time_cells", lambda *a, **k: {"timeout": True, "phase": "time", "seconds": 9.0})
    result = bench_models([GELU], ["elementwise", "unfused"], runs=2)
    for cell in result["models"][0]["policies"].values():
        assert cell["timeout"] and cell["phase"] == "time" and cell["ms"] is None and cell["kernels"] >= 1
    assert result["models"][0]["ort_ms"] is None


def test_settle_runs_the_calls_at_least_once_and_for_its_time(monkeypatch):
    from engine.schedule import measure

    now, ran = [0], []
    monkeypatch.setattr(measure.time, "perf_counter_ns", lambda: now[0])

    def call():
        ran.append(1)
        now[0] += 1000  # 1 µs a run
    measure.settle([call], 0.0)
    assert len(ran) == 1
    measure.settle([call], 10e-6)
    assert len(ran) == 1 + 10
