"""Every value computed once per tile (engine/codegen/count.py, the rules in engine/schedule/validate.py):
a corpus of reduction chains as exporters write them, each under every policy, printed as C (run on
the CPU) and as CUDA (run by the cuda-sim emulator), against onnxruntime; and the cost model's flops
equal to the kernel IR's count on every sample."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from chains import CHAINS  # noqa: E402
from support import max_rel_error, run_ort  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.codegen.count import count_kernel  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.device import get_device  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402
from engine.schedule.policies import POLICIES  # noqa: E402
from engine.schedule.validate import validate  # noqa: E402

A100 = get_device("a100")
TOL = 1e-4


def _chain(tmp_path, name: str):
    model, inputs, extents = CHAINS[name]()
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path, inputs, extents


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", sorted(CHAINS))
def test_reduction_chain_computes_each_value_once(tmp_path, name: str, policy: str) -> None:
    """The work one thread spends on one output element is at most the chain's reduction extents added
    up (nested re-evaluation would multiply them), the plan's flops are the kernel IR's, and both the C
    and the CUDA printed from that IR match onnxruntime — the CUDA with no emulator finding."""
    path, inputs, extents = _chain(tmp_path, name)
    graph, plan = plan_model(load_graph(path), policy, A100)
    assert validate(plan, graph, A100) == []
    program = generate(plan, graph, A100)
    for kernel in program.kernels:
        work = count_kernel(kernel)
        assert work.nest <= sum(extents), f"{kernel.name}: {work.nest} multiply-adds per element"
        assert work.flops == pytest.approx(_group(plan, kernel.name).cost.flops, rel=1e-9, abs=1)
    want = run_ort(path, inputs)
    for backend in ("cpu", "cuda-sim"):
        result = run_model(graph, inputs, plan=plan, backend=backend, device="a100")
        assert max(max_rel_error(result.outputs[k], want[k]) for k in want) <= TOL, backend
        if backend == "cuda-sim":
            assert result.sim.ok, "\n".join(result.sim.summary_lines())


def test_nested_re_evaluation_is_refused_with_its_count(tmp_path) -> None:
    """The transformer MLP with every edge at REGISTER but the LayerNorms' statistics (what the old
    codegen printed: each element of the second GEMM re-running a row of the first GEMM through the
    GELU): validate refuses it, naming a contraction read again per element and the count; with the
    GEMM outputs at SHARED the same chain is legal and each value is computed once."""
    from plans import make_test_plan

    from engine.ir.graph import StageKind
    from engine.schedule.plan import Conn, Tile

    path, _, extents = _chain(tmp_path, "transformer_mlp")
    graph = load_graph(path)
    stats = {(p, c): Conn.SHARED if graph.stage(p).kind == StageKind.REDUCE else Conn.REGISTER for p, c in graph.edges}
    out = graph.outputs[0]
    tile = {out: Tile(out, (8, 48), 64, 8)}
    bad = validate(make_test_plan(graph, stats, tile), graph, A100)
    nested = [v for v in bad if v.rule == "register_one_to_many" and graph.stage(v.subject.split()[1]).kind
              == StageKind.CONTRACTION]
    # Each of the 48 output columns re-runs the row (and the LayerNorm after it reads the sum 3 times).
    factor = int(re.search(r"recompute ([\d,]+)x > 1x", nested[0].message).group(1).replace(",", ""))
    assert nested and factor >= 48
    # Computed once: a value goes to shared memory unless its only consumer reads it element for
    # element (an epilogue, a chain of elementwise stages).
    once = {(p, c): Conn.REGISTER if graph.stage(c).kind == StageKind.ELEMENTWISE and len(graph.consumers[p]) == 1
            and graph.stage(c).shape == graph.stage(p).shape else Conn.SHARED for p, c in graph.edges}
    plan = make_test_plan(graph, once, tile)
    assert validate(plan, graph, A100) == []
    program = generate(plan, graph, A100)
    assert max(count_kernel(k).nest for k in program.kernels) <= max(extents)


@pytest.mark.parametrize("policy", POLICIES)
def test_model_flops_are_the_kernel_ir_count_on_every_sample(policy: str) -> None:
    """One count, two readers: each kernel's modeled flops are what the kernel IR counts in the code it
    prints (the cost model realises the same segments at its chosen tiles)."""
    from support import sample_path

    names = ["bert_layer", "conv_bn_relu", "gelu_chain", "layernorm_residual", "lstm", "masked_softmax",
             "mobilenetv2_block", "nerf_mlp", "pow_broadcast_add", "vit_block"]
    for name in names:
        graph, plan = plan_model(load_graph(sample_path(name)), policy, A100)
        program = generate(plan, graph, A100)
        for kernel in program.kernels:
            counted = count_kernel(kernel).flops
            assert counted == pytest.approx(_group(plan, kernel.name).cost.flops, rel=1e-9, abs=1), \
                f"{name} {policy} {kernel.name}"


def _group(plan, name: str):
    return next(g for g in plan.groups if g.name == name)
