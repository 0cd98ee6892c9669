"""`tileweave plan` (engine/schedule/cli.py): table and JSON output, plan files, bad input → exit 2."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.schedule.plan import Edit, plan_to_json
from engine.schedule.policies import make_plan


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["plan", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_summary(attn_path, capsys):
    code, out, _ = _run(capsys, attn_path, "--policy", "welder", "--device", "h100", "--json")
    assert code == 0
    data = json.loads(out)
    for key in ("kernels", "memory_intensive_kernels", "dram_bytes", "modeled_us", "schedule_seconds", "groups"):
        assert key in data
    g = data["groups"][0]
    for key in ("stages", "edges", "tile", "threads", "blocks", "waves", "traffic_bytes", "modeled_us"):
        assert key in g
    assert all({"connection", "reason"} <= set(e) for e in g["edges"])
    assert data["kernels"] == len(data["groups"]) and data["device"] == "h100"


def test_table(attn_path, capsys):
    code, out, _ = _run(capsys, attn_path, "--policy", "unfused")
    assert code == 0
    assert "kernel" in out.splitlines()[0] and "7 kernels" in out


def test_plan_out_and_in_replays_edits(attn_graph, attn_path, a100, tmp_path, capsys):
    from engine.schedule.edits import replay

    plan = replay("unfused", [Edit.make("merge", producer="mm", consumer="add")], attn_graph, a100)
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan_to_json(plan)))
    code, out, _ = _run(capsys, attn_path, "--plan-in", saved, "--json", "--plan-out", tmp_path / "again.json")
    assert code == 0
    data = json.loads(out)
    assert data["policy"] == "user" and data["kernels"] == plan.kernels
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["edits"] == plan_to_json(plan)["edits"]


@pytest.mark.parametrize("device_text, suffix", [("{not json", ".json"), ('sm_count = "many"\nbase = "a100"', ".toml")])
def test_bad_device_file(attn_path, tmp_path, capsys, device_text, suffix):
    path = tmp_path / f"dev{suffix}"
    path.write_text(device_text)
    code, _, err = _run(capsys, attn_path, "--device", path)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_unknown_device(attn_path, capsys):
    code, _, err = _run(capsys, attn_path, "--device", "tpu9")
    assert code == 2 and "tpu9" in err


def test_plan_from_another_model(attn_graph, a100, tmp_path, capsys):
    import onnx
    from sched_graphs import attention_model

    other = tmp_path / "other.onnx"
    onnx.save(attention_model(seed=5), other)
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan_to_json(make_plan(attn_graph, "unfused", a100))))
    code, _, err = _run(capsys, other, "--plan-in", saved)
    assert code == 2 and "made for model" in err


def test_plan_of_another_schema(attn_graph, attn_path, a100, tmp_path, capsys):
    data = plan_to_json(make_plan(attn_graph, "unfused", a100))
    data["schema"] = 99
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(data))
    code, _, err = _run(capsys, attn_path, "--plan-in", saved)
    assert code == 2 and "schema" in err


def test_illegal_edit_in_plan_file(attn_graph, attn_path, a100, tmp_path, capsys):
    data = plan_to_json(make_plan(attn_graph, "unfused", a100))
    data["edits"] = [{"kind": "set_edge", "args": {"producer": "add", "consumer": "sm::exp", "conn": "register"}}]
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(data))
    code, _, err = _run(capsys, attn_path, "--plan-in", saved)
    assert code == 2 and "group_cycle" in err


def test_missing_plan_file(attn_path, tmp_path, capsys):
    code, _, err = _run(capsys, attn_path, "--plan-in", tmp_path / "nope.json")
    assert code == 2 and "cannot read plan" in err


def test_tf32_is_a_plan_option_and_refused_with_a_saved_plan(attn_path, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, _, _ = _run(capsys, attn_path, "--policy", "welder", "--device", "a100", "--tf32", "--plan-out", out)
    assert code == 0 and json.loads(out.read_text())["options"]["tf32"] is True
    code = main(["run", str(attn_path), "--backend", "cuda-sim", "--plan-in", str(out), "--tf32",
                 "--outputs", str(tmp_path / "o.npz")])
    _, err = capsys.readouterr()
    assert code == 2 and "--tf32" in err and "Traceback" not in err


def test_thread_mapping_edit_in_plan_file(attn_graph, attn_path, a100, tmp_path, capsys):
    """A set_tile edit's thread_shape replays from a plan file and shows in the JSON; one that does not fit
    the tile's threads exits 2 with one line naming the mappings that do."""
    data = plan_to_json(make_plan(attn_graph, "unfused", a100))
    saved = tmp_path / "plan.json"
    edit = {"stage": "mm", "shape": [16, 24], "threads": 64}
    data["edits"] = [{"kind": "set_tile", "args": edit | {"thread_shape": [3, 20]}}]
    saved.write_text(json.dumps(data))
    code, _, err = _run(capsys, attn_path, "--plan-in", saved)
    assert code == 2 and "mappings that fit: " in err and "16x4" in err and len(err.strip().splitlines()) <= 2
    data["edits"] = [{"kind": "set_tile", "args": edit | {"thread_shape": [16, 4]}}]
    saved.write_text(json.dumps(data))
    code, out, _ = _run(capsys, attn_path, "--plan-in", saved, "--json")
    assert code == 0
    (seg,) = [s for g in json.loads(out)["groups"] for s in g["segments"] if s["anchor"] == "mm"]
    assert seg["thread_shape"] == [16, 4]
