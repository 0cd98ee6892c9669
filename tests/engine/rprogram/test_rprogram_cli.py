"""Tests for engine/rprogram/cli.py: `tileweave rprogram` text/JSON output, trace file, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rprogram_plans import unfused_plan

from engine.cli import main
from engine.frontend.importer import load_graph
from engine.rprogram.model import rprogram_from_json
from engine.rprogram.trace import validate_trace
from engine.rprogram.wavefront import check_rprogram
from engine.schedule.plan import plan_to_json

ROOT = Path(__file__).resolve().parents[3]
MODEL = str(ROOT / "samples" / "layernorm_residual.onnx")


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_to_json(unfused_plan(load_graph(MODEL)))))
    return path


def test_json_output_trace_and_rprogram_file(plan_file, tmp_path, capsys) -> None:
    trace, out = tmp_path / "t.json", tmp_path / "rp.json"
    assert main(["rprogram", MODEL, "--plan", str(plan_file), "--json", "--trace", str(trace),
                 "--out", str(out), "--device", "v100"]) == 0
    info = json.loads(capsys.readouterr().out)
    for key in ("makespan_us", "sequential_us", "utilization", "waves", "veus", "speedup"):
        assert key in info
    assert info["device"] == "v100" and info["veus"] == 80 * 8
    assert 0 < info["makespan_us"] < info["sequential_us"]
    assert validate_trace(json.loads(trace.read_text())) == []
    rp = rprogram_from_json(json.loads(out.read_text()))
    assert check_rprogram(rp) == [] and rp.summary()["makespan_us"] == info["makespan_us"]


def test_text_output(plan_file, capsys) -> None:
    assert main(["rprogram", MODEL, "--plan", str(plan_file), "--no-merge"]) == 0
    text = capsys.readouterr().out
    assert "makespan" in text and "sequential" in text and "utilization" in text and "vEUs" in text


def test_bad_inputs_exit_2(plan_file, tmp_path, capsys) -> None:
    assert main(["rprogram", str(ROOT / "samples" / "gelu_chain.onnx"), "--plan", str(plan_file)]) == 2
    assert "was made for model" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    assert main(["rprogram", MODEL, "--plan", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["rprogram", MODEL, "--plan", str(plan_file), "--device", "tpu"]) == 2
    assert "unknown device" in capsys.readouterr().err
    assert main(["rprogram", MODEL, "--plan", str(plan_file), "--trace", str(tmp_path / "no" / "t.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_lstm_rprogram_beats_half_of_sequential(capsys) -> None:
    # The target: an LSTM's per-step kernels are tiny, so the rProgram (split variants for the
    # under-filled waves, kernels side by side, one launch) takes at most half the sequential time.
    lstm = str(ROOT / "samples" / "lstm.onnx")
    assert main(["rprogram", lstm, "--policy", "welder", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["makespan_us"] <= 0.5 * info["sequential_us"]
    assert info["makespan_us"] >= info["critical_path_us"] - 1e-6


def test_welder_batches_qkv_unless_switched_off(capsys) -> None:
    bert = str(ROOT / "samples" / "bert_layer.onnx")
    assert main(["rprogram", bert, "--json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert any("batched into" in d for d in on["batching"])
    assert main(["rprogram", bert, "--json", "--no-batching"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["batching"] == [] and off["kernels"] >= 1
