"""`tileweave run --backend cuda-sim` (engine/commands.py): outputs, the report lines, exit 1 on findings with
one line per finding kind, the full report with --json, and one-line errors for bad options."""

from __future__ import annotations

import json

import numpy as np
from support import max_rel_error, sample_path

import engine.api
from engine.cli import main
from engine.device import PRESETS
from engine.runtime.execute import RunResult
from engine.runtime.simt.report import Finding, KernelTraffic, SimReport


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cuda_sim_runs_the_printed_cuda_and_reports_no_findings(capsys, tmp_path):
    io = sample_path("gelu_chain").with_suffix(".io.npz")
    code, out, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cuda-sim", "--inputs", io,
                             "--outputs", tmp_path / "o.npz")
    assert code == 0, out + err
    assert max_rel_error(np.load(tmp_path / "o.npz")["y"], np.load(io)["y"]) <= 1e-4
    assert "cuda-sim: no findings in 1 launch(es)" in out
    assert "cuda-sim traffic k00_" in out and "modeled: dram" in out


def test_cuda_sim_json_report(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cuda-sim", "--policy", "unfused",
                           "--sim-grid-cap", "2", "--json", "--outputs", tmp_path / "o.npz")
    assert code == 0
    report = json.loads(out)
    assert report["ok"] and report["findings"] == [] and report["launches"] == len(report["kernels"]) > 1
    assert all(k["global_store_bytes"] > 0 for k in report["kernels"])


def _finding(kind: str, line: int) -> Finding:
    return Finding(kind, "k00_x", "k00_x.cu", line, "y[i] = v;", (1, 0, 0), (3, 0, 0), "y", f"{kind} here", 2)


def test_findings_fail_the_run_with_one_line_per_kind(capsys, tmp_path, monkeypatch):
    report = SimReport((_finding("race", 12), _finding("race", 14), _finding("out_of_range", 20)),
                       (KernelTraffic("k00_x", 1, 8, 4, 0, 0),), 1)

    def fake_run_model(graph, inputs, *, backend, device, plan, sim_grid_cap, sim_resident, budget, time_limit):
        assert (backend, sim_grid_cap, sim_resident, time_limit) == ("cuda-sim", None, 3, None)
        assert budget.nbytes <= PRESETS["a100"].memory_bytes  # cuda-sim stands in for the GPU: at most its memory
        return RunResult({"y": np.ones((2, 2), np.float32)}, None, None, report)

    monkeypatch.setattr(engine.api, "run_model", fake_run_model, raising=False)
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cuda-sim", "--sim-resident", "3",
                           "--outputs", tmp_path / "o.npz")
    assert code == 1
    lines = [x for x in out.splitlines() if x.startswith("cuda-sim ") and "traffic" not in x]
    assert lines == [
        "cuda-sim out_of_range: 1 finding(s); first: k00_x k00_x.cu:20: out_of_range here (x2)",
        "cuda-sim race: 2 finding(s); first: k00_x k00_x.cu:12: race here (x2)",
    ]
    code, out, _ = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cuda-sim", "--sim-resident", "3",
                           "--json", "--outputs", tmp_path / "o.npz")
    assert code == 1
    assert [f["line"] for f in json.loads(out)["findings"]] == [12, 14, 20]


def test_bad_cuda_sim_options_are_one_line_errors(capsys, tmp_path):
    for argv, needle in ((["--backend", "cuda-sim", "--sim-grid-cap", "-1"], "--sim-grid-cap"),
                         (["--backend", "cuda-sim", "--sim-resident", "0"], "--sim-resident"),
                         (["--backend", "cpu", "--json"], "cuda-sim only")):
        code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), *argv, "--outputs", tmp_path / "o.npz")
        assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
