"""Annotated ONNX: every node that became stages names its kernel, connections and modeled µs in its
metadata_props; the model carries the plan; the file loads back with onnx; the CLI writes it."""

from __future__ import annotations

import random
from pathlib import Path

import onnx
import pytest

from engine.bundle.annotate import annotate_onnx, node_annotations
from engine.cli import main
from engine.errors import ModelError
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "samples" / "bert_layer.onnx"
ZOO = ROOT / "samples" / "zoo" / "convnext.onnx"


def props(node) -> dict[str, str]:
    return {p.key: p.value for p in node.metadata_props}


@pytest.fixture(scope="module")
def planned():
    return plan_model(load_graph(SAMPLE), "welder", "a100")  # operator-batched graph: renamed stages


def test_each_node_names_its_kernel_connections_and_times(planned):
    graph, plan = planned
    rng = random.Random(11)
    measured = {g.name: rng.uniform(1, 50) for g in plan.groups}
    model = onnx.load_from_string(annotate_onnx(SAMPLE, graph, plan, measured))
    onnx.checker.check_model(model)
    kernels = {g.name: g for g in plan.groups}
    tagged = 0
    for k, node in enumerate(model.graph.node):
        p = props(node)
        stages = [s for s in graph.stages if (node.name or f"{node.op_type}_{k}") in s.origin]
        if not stages:
            assert "tileweave.kernel" not in p  # folded at import: no kernel to name
            continue
        tagged += 1
        names = p["tileweave.kernel"].split(", ")
        assert names[0] == plan.group_of(stages[0].name).name and all(n in kernels for n in names)
        assert float(p["tileweave.kernel_modeled_us"]) == pytest.approx(
            sum(kernels[n].cost.modeled_us for n in names), abs=1e-3)
        assert float(p["tileweave.kernel_measured_us"]) == pytest.approx(sum(measured[n] for n in names), abs=1e-3)
        assert p["tileweave.connection"]
    assert tagged >= 20
    compute = [n for n in model.graph.node if n.op_type in ("MatMul", "Softmax", "Erf")]
    assert compute and all("tileweave.kernel" in props(n) for n in compute)
    top = props(model)
    assert top["tileweave.plan_hash"] == plan.plan_hash and top["tileweave.kernels"] == str(plan.kernels)


def test_batched_contractions_keep_their_onnx_nodes(planned):
    graph, plan = planned
    notes = node_annotations(graph, plan)
    batched = [s for s in graph.stages if s.name.endswith(".batched")]
    assert batched and all(o in notes for s in batched for o in s.origin)


def test_cli_writes_an_annotated_model_of_a_zoo_export(tmp_path, capsys):
    out = tmp_path / "annotated.onnx"
    assert main(["export", str(ZOO), "--annotated-onnx", str(out)]) == 0
    model = onnx.load(str(out))
    kernels = {props(n).get("tileweave.kernel") for n in model.graph.node} - {None}
    assert kernels and all(k.startswith("k") for k in kernels)
    assert "namespace" in props(model.graph.node[0])  # the exporter's own metadata is kept
    assert "annotated with" in capsys.readouterr().out


def test_nothing_to_export_and_a_bad_model_are_one_line(tmp_path, capsys, planned):
    assert main(["export", str(SAMPLE)]) == 2
    assert "nothing to export" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(bytes(random.Random(5).randrange(256) for _ in range(64)))
    with pytest.raises(ModelError, match="cannot read the ONNX model"):
        annotate_onnx(bad, *planned)
