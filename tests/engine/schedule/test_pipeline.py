"""engine/schedule/pipeline.py: plan_model batches Q/K/V-style contractions for welder (switchable),
records it in the plan, and load_plan brings a saved batched plan back onto the model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import max_rel_error, run_ort, sample_path

from engine.cli import main
from engine.errors import PlanError
from engine.frontend.importer import load_graph
from engine.ir.graph import StageKind
from engine.runtime.execute import run_model
from engine.runtime.inputs import make_inputs
from engine.schedule.pipeline import batching_decisions, graph_for_plan, load_plan, plan_model
from engine.schedule.plan import plan_from_json, plan_to_json

BERT = sample_path("bert_layer")
QKV = ("encoder.layer.0/MatMul_15_out", "encoder.layer.0/MatMul_31_out", "encoder.layer.0/MatMul_47_out")


@pytest.fixture(scope="module")
def bert():
    return load_graph(BERT)


@pytest.fixture(scope="module")
def batched(bert):
    return plan_model(bert, "welder", "a100")


def _contractions(graph):
    return [s for s in graph.stages if s.kind == StageKind.CONTRACTION]


def test_welder_batches_qkv_into_one_contraction(bert, batched):
    graph, plan = batched
    merged = [s for s in _contractions(graph) if s.name.endswith(".batched")]
    assert len(merged) == 1 and merged[0].shape == (1, 128, 3 * 768)
    assert len(_contractions(graph)) == len(_contractions(bert)) - 2
    assert plan.model_hash == graph.structural_hash != bert.structural_hash
    assert dict(plan.options)["batching"] is True
    first = plan.decisions[0]
    assert first.startswith("batching: ") and all(q in first for q in QKV)
    assert f"batched into {merged[0].name}" in first and "one [1, 128, 2304] contraction instead of 3" in first
    assert merged[0].name in {s for g in plan.groups for s in g.stages}


def test_batching_switch_and_default(bert):
    graph, plan = plan_model(bert, "welder", "a100", batching=False)
    assert graph is bert and dict(plan.options)["batching"] is False
    assert batching_decisions(plan) == () and not any(s.name.endswith(".batched") for s in graph.stages)
    graph, plan = plan_model(bert, "stitch", "a100")
    assert graph is bert and dict(plan.options)["batching"] is False and batching_decisions(plan) == ()


def test_saved_plan_round_trips_through_load_plan(bert, batched, tmp_path):
    graph, plan = batched
    data = plan_to_json(plan)
    with pytest.raises(PlanError, match="not this one"):
        plan_from_json(data, bert)  # the plain load cannot: the plan is for the batched graph
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    for source in (data, path, str(path)):
        g, p = load_plan(source, bert)
        assert g.structural_hash == graph.structural_hash and p == plan
    unbatched = plan_model(bert, "welder", "a100", batching=False)[1]
    g, p = load_plan(plan_to_json(unbatched), bert)
    assert g is bert and p == unbatched


@pytest.mark.parametrize("content, needle", [(None, "cannot read plan file"), ("{oops", "not valid JSON"),
                                             ("[1, 2]", "not a tileweave plan"), ('{"a": 1}', "no 'schema'")])
def test_load_plan_refuses_bad_files(bert, tmp_path, content, needle):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PlanError, match=needle) as err:
        load_plan(path, bert)
    assert "\n" not in str(err.value)


def test_graph_for_plan_accepts_either_graph(bert, batched):
    graph, plan = batched
    assert graph_for_plan(plan, graph) is graph
    assert graph_for_plan(plan, bert).structural_hash == graph.structural_hash


def test_run_model_with_batching_matches_onnxruntime(bert, batched):
    rng = np.random.default_rng(7)
    feeds = {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * 0.1 if v.dtype.kind == "f" else v)
             for k, v in make_inputs(bert, seed=3).items()}
    want = run_ort(BERT, feeds)
    _, plan = batched
    for result in (run_model(bert, feeds, backend="cpu"), run_model(bert, feeds, backend="cpu", plan=plan)):
        assert result.program.model_hash == plan.model_hash  # generated from the batched graph
        assert any(s.endswith(".batched") for k in result.program.kernels for s in k.stages)
        assert set(result.outputs) == set(want)
        for name, arr in want.items():
            assert max_rel_error(result.outputs[name], arr) <= 1e-4


def test_plan_cli_json_shows_batching_and_round_trips(tmp_path, capsys):
    out_path = tmp_path / "plan.json"
    assert main(["plan", str(BERT), "--json", "--plan-out", str(out_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["batching"]) == 1 and all(q in data["batching"][0] for q in QKV)
    assert "batched into" in data["batching"][0]
    assert main(["plan", str(BERT), "--json", "--plan-in", str(out_path)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["batching"] == data["batching"] and again["kernels"] == data["kernels"]
    assert main(["plan", str(BERT), "--json", "--no-batching"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["batching"] == [] and not any(".batched" in s for g in off["groups"] for s in g["stages"])
    assert main(["plan", str(BERT)]) == 0
    assert "batching: " in capsys.readouterr().out


def test_saved_batched_plan_runs_compiles_and_schedules(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert main(["plan", str(BERT), "--plan-out", str(plan_path)]) == 0
    saved = json.loads(plan_path.read_text())
    assert saved["options"] == {"batching": True}
    io = BERT.with_suffix(".io.npz")
    out = tmp_path / "o.npz"
    assert main(["run", str(BERT), "--backend", "cpu", "--plan-in", str(plan_path), "--inputs", str(io),
                 "--outputs", str(out)]) == 0
    with np.load(io) as given:
        feeds = {k: given[k] for k in given.files if k != "out"}
    assert max_rel_error(np.load(out)["out"], run_ort(BERT, feeds)["out"]) <= 1e-4
    for args, batched in ((["--plan-in", str(plan_path)], True), ([], True), (["--no-batching"], False)):
        folder = tmp_path / f"c{len(args)}{batched}"
        assert main(["compile", str(BERT), "--target", "c", "-o", str(folder), *args]) == 0
        program = json.loads((folder / "program.json").read_text())
        stages = {s for k in program["kernels"] for s in k["stages"]}
        assert any(s.endswith(".batched") for s in stages) == batched
        if args:
            assert program["model_hash"] == (saved["model_hash"] if batched else load_graph(BERT).structural_hash)
    capsys.readouterr()
    assert main(["rprogram", str(BERT), "--plan", str(plan_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert len(info["batching"]) == 1 and "batched into" in info["batching"][0]


@pytest.mark.slow
def test_export_bundles_the_batched_plan(tmp_path, capsys):
    import io
    import zipfile

    out = tmp_path / "b.zip"
    assert main(["export", str(BERT), "--arch", "sm_80", "-o", str(out)]) == 0
    with zipfile.ZipFile(out) as z:
        plan = json.loads(z.read("plan.json"))
        program = json.loads(z.read("program.json"))
    assert plan["options"] == {"batching": True} and plan["decisions"][0].startswith("batching: ")
    assert any(s.endswith(".batched") for k in program["kernels"] for s in k["stages"])
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    again = tmp_path / "again.zip"
    assert main(["export", str(BERT), "--arch", "sm_80", "--plan-in", str(plan_path), "-o", str(again)]) == 0
    with zipfile.ZipFile(io.BytesIO(again.read_bytes())) as z:
        assert json.loads(z.read("plan.json")) == plan
