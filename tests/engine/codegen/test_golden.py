"""Golden kernels (process replay): generated C and CUDA sources and the plan JSON for two samples
with fixed hand-built plans must stay identical; UPDATE_GOLDEN=1 rewrites tests/golden/ for review."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import fuse_all, make_test_plan  # noqa: E402
from sample_io import load_sample  # noqa: E402

from engine import flags  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.kir import program_to_json  # noqa: E402
from engine.codegen.targets import render_c, render_cuda  # noqa: E402
from engine.schedule.plan import plan_to_json  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
CASES = ("layernorm_residual", "masked_softmax")


def _artifacts(name: str) -> dict[str, str]:
    graph = load_sample(name)[0]
    plan = make_test_plan(graph, fuse_all(graph), policy="golden")
    program = generate(plan, graph, "a100")
    return {
        f"{name}.plan.json": json.dumps(plan_to_json(plan), indent=1, sort_keys=True) + "\n",
        f"{name}.program.json": json.dumps(program_to_json(program), indent=1, sort_keys=True) + "\n",
        f"{name}.c": render_c(program),
        f"{name}.cu": render_cuda(program),
    }


@pytest.mark.parametrize("name", CASES)
def test_golden_sources(name):
    for fname, text in _artifacts(name).items():
        path = GOLDEN / fname
        if flags.UPDATE_GOLDEN:
            GOLDEN.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            continue
        assert path.exists(), f"{path} missing: run UPDATE_GOLDEN=1 pytest {__file__}"
        assert path.read_text() == text, f"{fname} changed: review, then UPDATE_GOLDEN=1 to accept"
