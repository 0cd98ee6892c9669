"""Kernel bundles: complete, hashed, deterministic, compiled for every arch, loadable back."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from engine.bundle.export import bundle_info, export_bundle
from engine.cli import main
from engine.frontend.importer import load_graph
from engine.schedule.plan import plan_from_json
from engine.schedule.policies import make_plan

SAMPLE = Path(__file__).resolve().parents[3] / "samples" / "layernorm_residual.onnx"


@pytest.fixture(scope="module")
def bundle():
    graph = load_graph(SAMPLE)
    plan = make_plan(graph, "welder", "a100")
    return graph, plan, export_bundle(graph, plan, "a100")


def test_bundle_holds_every_artifact_with_matching_hashes(bundle):
    graph, plan, data = bundle
    info = bundle_info(data)  # raises if a file does not match its manifest hash
    assert info.archs == ("sm_80", "sm_90")
    assert info.kernels == len(plan.groups)
    names = set(info.files)
    for arch in info.archs:
        cubin = [n for n in names if n.endswith(f".{arch}.cubin")]
        ptx = [n for n in names if n.endswith(f".{arch}.ptx")]
        assert cubin and ptx
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            assert z.read(cubin[0])[:4] == b"\x7fELF"
            assert f".target {arch}" in z.read(ptx[0]).decode()
    assert {"program.json", "plan.json", "trace.json", "weights.npz", "run_bundle.py", "README.md",
            "c/program.json", f"c/{graph.name}.c"} <= names
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        program = json.loads(z.read("program.json"))
    assert len(program["kernels"]) == info.kernels
    for item in program["kernels"] + program["launches"]:  # every kernel: its own unit, PTX + CUBIN per arch
        files = [item["source"]] + [f for arch in info.archs for f in item["binaries"][arch].values()]
        assert {f["file"] for f in files} <= names
        assert all(manifest_hash(data, f["file"]) == f["sha256"] for f in files)
    for kernel in program["kernels"]:  # the compiled registers, per arch, read from each CUBIN
        for arch in info.archs:
            assert kernel["resources"][arch]["registers"] > 0


def test_bundle_plan_loads_back_for_its_model_and_runner_is_valid_python(bundle):
    graph, plan, data = bundle
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        back = plan_from_json(json.loads(z.read("plan.json")), graph)
        runner = z.read("run_bundle.py").decode()
        program = json.loads(z.read("program.json"))
        trace = json.loads(z.read("trace.json"))
    assert back.edges == plan.edges
    compile(runner, "run_bundle.py", "exec")
    assert "from engine" not in runner and "import engine" not in runner
    assert sorted(ln["kernel"] for ln in program["launches"]) == sorted(g.name for g in plan.groups)
    assert trace["traceEvents"]


def test_bundle_is_deterministic(bundle):
    graph, plan, data = bundle
    assert export_bundle(graph, plan, "a100") == data


def test_export_cli_writes_zip_and_refuses_bad_output(tmp_path, capsys):
    out = tmp_path / "b.zip"
    assert main(["export", str(SAMPLE), "--policy", "stitch", "--arch", "sm_90", "-o", str(out)]) == 0
    assert bundle_info(out.read_bytes()).archs == ("sm_90",)
    assert main(["export", str(SAMPLE), "-o", str(tmp_path / "missing" / "b.zip")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def manifest_hash(data: bytes, name: str) -> str:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return json.loads(z.read("manifest.json"))["sha256"][name]


def test_bundle_weights_are_npy_1_0_members_that_load_back_exactly(bundle):
    import numpy as np

    from engine.bundle.export import npz_bytes

    graph, _, data = bundle
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        weights = z.read("weights.npz")
    with zipfile.ZipFile(io.BytesIO(weights)) as z:
        for name in z.namelist():
            head = z.read(name)[:10]
            assert head[:8] == b"\x93NUMPY\x01\x00", name  # format 1.0: read by every NumPy
            assert b"\x00" not in z.read(name)[10:10 + int.from_bytes(head[8:10], "little")], name
    with np.load(io.BytesIO(weights), allow_pickle=False) as back:
        assert set(back.files) == set(graph.weights)
        for name, value in graph.weights.items():
            assert back[name].dtype == value.dtype and np.array_equal(back[name], value)
    assert npz_bytes(graph.weights) == weights  # deterministic
