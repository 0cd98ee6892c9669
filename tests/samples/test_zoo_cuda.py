"""Every zoo model's CUDA, as a GPU user gets it, compiles: each policy planned for the h200 preset (what
`tileweave run --backend cuda` plans on an H200) and its program compiled by NVRTC for sm_90. No GPU needed.
The samples' kernels are compiled in the default run (tests/engine/codegen/test_cuda_compile.py); real
exports give the generator shapes ours do not: on 2026-11-30 an H200 refused zoo swin's welder kernel (a
region table printed nowhere, benchmarks/NOTES.md gpu-2026-11-30) that no CPU test had compiled. Slow
(planning and NVRTC, ~5 minutes on two cores): `make test-zoo-cuda`, which .ci/run runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.api import load_graph
from engine.codegen.generate import generate
from engine.codegen.nvrtc import compile_cuda
from engine.codegen.targets import render_cuda
from engine.device import get_device
from engine.schedule.pipeline import plan_model

ZOO = Path(__file__).resolve().parents[2] / "samples" / "zoo"
MODELS = [e["name"] for e in json.loads((ZOO / "catalog.json").read_text())]
POLICIES = ("unfused", "elementwise", "stitch", "welder")


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_every_zoo_policy_compiles_for_the_h200(model):
    device = get_device("h200")
    graph = load_graph(ZOO / f"{model}.onnx")
    for policy in POLICIES:
        planned, plan = plan_model(graph, policy, device)
        program = generate(plan, planned, device, target="cuda")
        binary = compile_cuda(render_cuda(program), name=program.name, arch="sm_90")
        for k in program.kernels:
            assert f".entry {k.name}(" in binary.ptx, (policy, k.name)
        assert binary.cubin[:4] == b"\x7fELF", policy
