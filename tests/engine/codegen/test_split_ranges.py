"""Index-set splitting in the C target (ctarget.split_ranges): a per-element phase whose body tests its
innermost variable alone (a concatenation's select along that axis, a bounds guard, a padded load) runs the
innermost loop in pieces, each printed with the tests folded. The cut positions against brute force on
random affine tests; concatenations and pads of random widths under random tiles, printed, compiled and
compared with NumPy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import fuse_all, make_test_plan  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.codegen.ctarget import MAX_PIECES, for_c, index_cuts  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.kir import program_to_json  # noqa: E402
from engine.codegen.targets import render_c  # noqa: E402
from engine.ir import expr as E  # noqa: E402
from engine.ir import index as I  # noqa: E402
from engine.ir.dtypes import DType  # noqa: E402
from engine.runtime.cpu import compile_program_c, run_cpu  # noqa: E402
from engine.schedule.plan import Conn, Tile  # noqa: E402

OPS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal}


@pytest.mark.parametrize("seed", range(40))
def test_index_cuts_are_where_the_tests_change_value(seed):
    """Selects on k * i + c compared with a constant (either side, any comparison, k of either sign): the cuts
    are exactly the positions where one of the tests differs from the position before it."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    body = E.imm(0.0, DType.F32)
    tests = []
    for _ in range(int(rng.integers(1, 4))):
        k = int(rng.choice([-3, -2, -1, 1, 2, 3]))
        c, m = int(rng.integers(-40, 40)), int(rng.integers(-40, 80))
        op = str(rng.choice(sorted(OPS)))
        iv = E.index_val(I.Lin(((I.Var("i1"), k),), c))
        cond = E.binary(op, iv, E.imm(m, DType.I64)) if rng.random() < 0.5 else \
            E.binary({"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}.get(op, op), E.imm(m, DType.I64), iv)
        body = E.select(cond, E.imm(float(len(tests) + 1), DType.F32), body)
        tests.append((k, c, m, op))
    pos = np.arange(n)
    held = np.stack([OPS[op](k * pos + c, m) for k, c, m, op in tests])
    want = tuple(int(t) for t in range(1, n) if (held[:, t] != held[:, t - 1]).any())
    assert index_cuts(None, body, "i1", n) == want


def _save(path: Path, nodes, inputs: dict[str, tuple]) -> Path:
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return path


def _fused(path: Path, tile: tuple[int, ...]):
    """The model's one fused kernel (every edge at REGISTER) as the C target prints it, and its graph."""
    graph = load_graph(path)
    out = graph.stage(graph.outputs[0])
    blocks = int(np.prod([-(-n // t) for n, t in zip(out.shape, tile)]))
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {out.name: Tile("", tile, 64, blocks)})
    return for_c(generate(plan, graph, "a100", target="c")), graph


def _phase_source(source: str, kernel: str) -> str:
    """The kernel's printed C: its tile loop's function (where one is split out) and its entry."""
    start = source.index(f"// {kernel}:")
    return source[start:source.index("\n}\n", source.index(f"\nvoid {kernel}(", start))]


@pytest.mark.parametrize("seed", range(6))
def test_a_concat_runs_each_arm_in_its_own_branch_free_loop(tmp_path, seed):
    """y = concat(cos(a), b, sin(c)) along the last axis, widths and the column tile random: the concat's phase
    records the arms' edges as its cuts, prints one `omp simd` loop per arm with no test inside (the cosine and
    sine each in their own piece only), and computes what NumPy does."""
    rng = np.random.default_rng(100 + seed)
    rows = int(rng.integers(1, 9))
    widths = [int(w) for w in rng.integers(1, 40, 3)]
    n = sum(widths)
    inputs = {name: (rows, w) for name, w in zip("abc", widths)}
    path = _save(tmp_path / "cat.onnx", [helper.make_node("Cos", ["a"], ["ca"]), helper.make_node("Sin", ["c"], ["sc"]),
                                         helper.make_node("Concat", ["ca", "b", "sc"], ["y"], axis=1)], inputs)
    cols = int(rng.choice([8, 16, 32, n]))
    program, graph = _fused(path, (1, min(cols, n)))
    (kernel,) = program.kernels
    phases = [p for s in kernel.segments for p in s.phases]
    assert [p.splits for p in phases if p.splits] == [(widths[0], widths[0] + widths[1])]
    assert program_to_json(program)["kernels"][0]["segments"][0]["splits"]
    text = _phase_source(render_c(program), kernel.name)
    assert text.count("#pragma omp simd") == 3
    assert "if (" not in text and " ? g_" not in text  # no guard, no masked load
    assert text.count("c0_sincosf(") == 2  # the cosine's piece and the sine's, once each
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}
    outs, _ = run_cpu(compile_program_c(program), graph.specs, feeds, graph.weights)
    want = np.concatenate([np.cos(feeds["a"]), feeds["b"], np.sin(feeds["c"])], axis=1)
    np.testing.assert_allclose(outs["y"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_a_padded_row_runs_its_pads_and_its_middle_apart(tmp_path, seed):
    """y = exp(pad(x)) along the last axis, pads and tile random: cuts at the pad's edges, the middle piece loads
    without a bounds test, the pads are exp(0) without a load; values as NumPy's."""
    rng = np.random.default_rng(200 + seed)
    rows, w = int(rng.integers(1, 6)), int(rng.integers(2, 50))
    left, right = (int(p) for p in rng.integers(1, 9, 2))
    pads = helper.make_tensor("pads", TensorProto.INT64, [4], [0, left, 0, right])
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]), helper.make_node("Exp", ["p"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [pads])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "pad.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    n = left + w + right
    program, g = _fused(path, (1, min(int(rng.choice([8, 16, n])), n)))
    phases = [p for k in program.kernels for s in k.segments for p in s.phases]
    assert [p.splits for p in phases if p.splits] == [(left, left + w)]
    text = _phase_source(render_c(program), program.kernels[0].name)
    assert text.count("#pragma omp simd") == 3 and "if (" not in text and " ? g_" not in text
    x = rng.standard_normal((rows, w)).astype(np.float32)
    outs, _ = run_cpu(compile_program_c(program), g.specs, {"x": x}, g.weights)
    np.testing.assert_allclose(outs["y"], np.exp(np.pad(x, ((0, 0), (left, right)))), rtol=1e-5, atol=1e-6)


def test_too_many_pieces_are_not_split(tmp_path):
    """A concatenation of more than MAX_PIECES arms keeps one loop (each piece prints the body once)."""
    names = [f"x{k}" for k in range(MAX_PIECES + 1)]
    path = _save(tmp_path / "many.onnx", [helper.make_node("Concat", names, ["y"], axis=1)], {n: (2, 3) for n in names})
    program, graph = _fused(path, (1, 3 * len(names)))
    assert not any(p.splits for k in program.kernels for s in k.segments for p in s.phases)
    feeds = {n: np.random.default_rng(k).standard_normal((2, 3)).astype(np.float32) for k, n in enumerate(names)}
    outs, _ = run_cpu(compile_program_c(program), graph.specs, feeds, graph.weights)
    np.testing.assert_array_equal(outs["y"], np.concatenate([feeds[n] for n in names], axis=1))
