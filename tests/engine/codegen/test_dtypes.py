"""Kernels for the less common element types: float64 and small integers run on the cpu backend and
match onnxruntime; bfloat16 runs through codegen; float8 graphs are refused before codegen with a one-line error."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from engine.cli import main
from engine.frontend.importer import load_graph
from engine.runtime.execute import run_model


def _binary_model(elem: int, op: str = "Add") -> onnx.ModelProto:
    x, y, z = (helper.make_tensor_value_info(n, elem, [4, 8]) for n in "xyz")
    graph = helper.make_graph([helper.make_node(op, ["x", "y"], ["z"])], "g", [x, y], [z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("elem,dtype,op", [(TensorProto.DOUBLE, np.float64, "Mul"), (TensorProto.UINT8, np.uint8, "Add"),
                                           (TensorProto.INT16, np.int16, "Sub"), (TensorProto.INT8, np.int8, "Max")])
def test_small_and_wide_types_run_on_cpu(tmp_path, elem, dtype, op):
    path = tmp_path / "m.onnx"
    onnx.save(_binary_model(elem, op), path)
    rng = np.random.default_rng(3)
    feeds = {n: (rng.random((4, 8)) * 10 + 1).astype(dtype) for n in "xy"}
    got = run_model(load_graph(path), feeds, backend="cpu", policy="welder").outputs["z"]
    want = ort.InferenceSession(str(path)).run(None, feeds)[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_float8_graph_is_refused_by_codegen(tmp_path, capsys):
    path = tmp_path / "f8.onnx"
    x, y = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]), helper.make_tensor_value_info(
        "y", TensorProto.FLOAT8E4M3FN, [4, 8])
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN)], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10), path)
    code = main(["run", str(path), "--backend", "cpu", "--outputs", str(tmp_path / "o.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "float8_e4m3fn" in err[0] and "--backend reference" in err[0]


def test_bfloat16_graph_runs_on_cpu_from_the_cli(tmp_path, capsys):
    """bf16 kernels (engine/codegen: bits + round-to-nearest-even helpers in C): the CLI runs a bf16 Mul on the
    cpu backend and its output matches the reference executor's bit for bit (one rounding of an exact product
    of two 8-bit significands, exact in fp32, so both round the same value to bf16)."""
    path = tmp_path / "bf16.onnx"
    onnx.save(_binary_model(TensorProto.BFLOAT16, "Mul"), path)
    outs = {b: tmp_path / f"{b}.npz" for b in ("cpu", "reference")}
    for backend, out in outs.items():
        assert main(["run", str(path), "--backend", backend, "--outputs", str(out)]) == 0, capsys.readouterr().err
    got, want = (np.load(outs[b], allow_pickle=False) for b in ("cpu", "reference"))
    assert got["z"].view(np.uint16).tolist() == want["z"].view(np.uint16).tolist()
    assert np.abs(got["z"].view(np.uint16)).any()


def test_tensor_past_32_bit_indexing_is_refused_before_planning(tmp_path, capsys):
    from engine.codegen.generate import INDEX_LIMIT, check_index_range
    from engine.errors import ShapeError

    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1 << 16, 1 << 16]) for n in "xy")
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(model, tmp_path / "big.onnx")
    graph = load_graph(tmp_path / "big.onnx")
    assert graph.inputs[0].size == 1 << 32 > INDEX_LIMIT
    with pytest.raises(ShapeError) as info:
        check_index_range(graph)
    assert "'x'" in str(info.value) and "32-bit" in str(info.value)
    # `tileweave plan` says so at once instead of tiling four billion elements for minutes.
    assert main(["plan", str(tmp_path / "big.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "32-bit" in err[0]
