"""The C printer's flat offsets (Printer.flat_offsets, index.join_divmod): a global tensor read through a
reshape that splits an axis, k * (x // k) + x % k in its row-major offset, is printed as the one affine offset
x — a contiguous load, no division or modulo per element — and computes what NumPy does."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import make_test_plan  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.targets import render_c, render_cuda  # noqa: E402
from engine.ir import index as I  # noqa: E402
from engine.runtime.cpu import compile_program_c, run_cpu  # noqa: E402


def test_join_divmod_joins_a_head_merge():
    """bert's [1, 4, 128, 32] -> [1, 128, 128] head merge read back: (i1 * 4 + i2 // 32) * 32 + i2 % 32."""
    i1, i2 = I.var("i1"), I.var("i2")
    assert I.join_divmod((i1 * 4 + I.floordiv(i2, 32)) * 32 + I.mod(i2, 32)) == i1 * 128 + i2
    # split twice: x // 8 // 2, x // 8 % 2, x % 8 over strides 16, 8, 1
    x = I.var("i0") * 3 + i1
    q = I.floordiv(x, 8)
    assert I.join_divmod(I.floordiv(q, 2) * 16 + I.mod(q, 2) * 8 + I.mod(x, 8)) == x
    # unpaired (another k, another coefficient): left as it is
    e = I.floordiv(i2, 32) * 16 + I.mod(i2, 32)
    assert I.join_divmod(e) == e


@pytest.mark.parametrize("heads,tokens,dim", [(4, 16, 8), (3, 5, 12), (2, 7, 32)])
def test_a_head_merge_reads_its_input_contiguously(tmp_path, heads, tokens, dim):
    """y = reshape(transpose(x, [0, 2, 1, 3]), [1, tokens, heads * dim]) + 1: the C load of the transposed
    tensor (its own kernel) is one affine offset, no '/' or '%'; the CUDA source keeps its per-axis form;
    values as NumPy's."""
    shape = [1, heads, tokens, dim]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "s"], ["r"]),
             helper.make_node("Add", ["r", "one"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([1, tokens, heads * dim], np.int64), "s"),
             onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "merge.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    g = load_graph(path)
    plan = make_test_plan(g)  # every edge a kernel boundary: the merged tensor is read from global memory
    def reads_of_t(source: str) -> list[str]:  # the transposed tensor `t`, read by the reshape's kernel
        return [line.strip() for line in source.splitlines() if "= g_t[" in line]

    (c_read,) = reads_of_t(render_c(generate(plan, g, "a100", target="c")))
    assert f"[({heads * dim} * i1 + i2)]" in c_read and "/" not in c_read and "%" not in c_read, c_read
    (cuda_read,) = reads_of_t(render_cuda(generate(plan, g, "a100")))
    assert f"(i2 / {dim})" in cuda_read and f"(i2 % {dim})" in cuda_read  # the CUDA printer keeps its form
    x = np.random.default_rng(heads).standard_normal(shape).astype(np.float32)
    outs, _ = run_cpu(compile_program_c(generate(plan, g, "a100", target="c")), g.specs, {"x": x}, g.weights)
    want = x.transpose(0, 2, 1, 3).reshape(1, tokens, heads * dim) + 1
    np.testing.assert_allclose(outs["y"], want, rtol=0, atol=0)
