"""GEMM micro-kernel parameters per device (engine/codegen/micro.py): the register and staging budgets,
vector widths per factor and double buffering chosen from the Device's figures, recorded in program.json."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import fuse_all, make_test_plan  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.kir import program_to_json  # noqa: E402
from engine.codegen.micro import micro_budget, stage_gemms, vector_width  # noqa: E402
from engine.device import Device, get_device  # noqa: E402
from engine.errors import DeviceError  # noqa: E402
from engine.schedule.plan import Conn, Tile  # noqa: E402

A100 = get_device("a100")


def _device(**changes) -> Device:
    return Device.from_dict(A100.to_dict() | {"name": "custom"} | changes)


def _matmul(path: Path, m: int, k: int, n: int, transposed_b: bool = False) -> Path:
    """y = a @ B (B a constant), or a @ b^T for an input b when `transposed_b` (b's columns not contiguous)."""
    rng = np.random.default_rng(5)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])]
    if transposed_b:
        nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]), helper.make_node("MatMul", ["a", "bt"], ["y"])]
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, k]))
        weights = []
    else:
        nodes = [helper.make_node("MatMul", ["a", "B"], ["y"])]
        weights = [onnx.numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "B")]
    graph = helper.make_graph(nodes, "mm", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                              weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _program(path: Path, device: Device, tile=(32, 32)):
    graph = load_graph(path)
    blocks = int(np.prod([-(-d // t) for d, t in zip(graph.stage("y").shape, tile)]))
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", tile, 64, blocks)})
    return generate(plan, graph, device)


def _gemm(program):
    (g,) = [g for k in program.kernels for g in k.gemms]
    return g


def test_budget_follows_registers_shared_memory_and_vector_width() -> None:
    b = micro_budget(A100)
    assert (b.accumulators, b.stage_bytes, b.vector, b.double_buffer) == (128, 48 * 1024, 4, True)
    small = micro_budget(_device(max_regs_per_thread=128, default_smem_per_block_bytes=16 * 1024, vector_load_bytes=8))
    # 64 accumulators + ~16 fragments + 24 base registers fit 128; 128 accumulators do not.
    assert (small.accumulators, small.stage_bytes, small.vector) == (64, 16 * 1024, 2)
    host = micro_budget(_device(kind="cpu", vector_lanes=8))
    assert (host.vector, host.double_buffer) == (1, False)


def test_vector_load_bytes_is_validated() -> None:
    with pytest.raises(DeviceError, match="vector_load_bytes"):
        _device(vector_load_bytes=12)


def test_aligned_gemm_gets_vector_loads_and_two_buffers(tmp_path) -> None:
    program = _program(_matmul(tmp_path / "mm.onnx", 64, 96, 64), A100)
    g = _gemm(program)
    assert (g.vec_a, g.vec_b, g.buffers) == (4, 4, 2)
    kernel = program.kernels[0]
    assert kernel.staging == (2 * g.a_elems, 2 * g.b_elems)
    recorded = program_to_json(program)["kernels"][0]["gemms"][0]
    assert recorded["stage"] == "y" and (recorded["vec_a"], recorded["vec_b"], recorded["buffers"]) == (4, 4, 2)
    assert (recorded["tm"], recorded["tn"], recorded["bk"]) == (g.tm, g.tn, g.bk)
    assert "double-buffered" in program_to_json(program)["kernels"][0]["segments"][0]["phases"][0]


def test_unaligned_strides_and_strided_columns_stay_scalar(tmp_path) -> None:
    # k = 45: a's rows start at multiples of 45 floats, b's rows too: no aligned vector of either.
    g = _gemm(_program(_matmul(tmp_path / "odd.onnx", 37, 45, 29), A100))
    assert (g.vec_a, g.vec_b) == (1, 1)
    # b read through a transpose: its columns are 96 floats apart (a stays contiguous along k).
    g = _gemm(_program(_matmul(tmp_path / "bt.onnx", 64, 96, 64, transposed_b=True), A100))
    assert (g.vec_a, g.vec_b) == (4, 1)


def test_tile_columns_not_a_multiple_of_the_width_stay_scalar(tmp_path) -> None:
    program = _program(_matmul(tmp_path / "mm.onnx", 64, 96, 64), A100, tile=(32, 30))
    assert _gemm(program).vec_b == 1  # tile columns start at multiples of 30


def test_device_without_room_for_a_second_buffer_keeps_one(tmp_path) -> None:
    path = _matmul(tmp_path / "mm.onnx", 64, 96, 64)
    one = _program(path, A100)
    g = _gemm(one)
    single = 4 * (g.a_elems + g.b_elems)
    tight = _device(max_smem_per_block_bytes=single + 1024, smem_per_sm_bytes=single + 1024,
                    default_smem_per_block_bytes=single + 1024, reserved_smem_per_block_bytes=0)
    assert _gemm(_program(path, tight)).buffers == 1
    # The pass is pure: the same kernel and device give the same kernel, twice.
    kernel = one.kernels[0]
    assert stage_gemms(kernel, A100) == stage_gemms(kernel, A100) == kernel


def test_cpu_device_keeps_scalar_single_buffered_staging(tmp_path) -> None:
    program = _program(_matmul(tmp_path / "mm.onnx", 64, 96, 64), _device(kind="cpu", vector_lanes=8))
    g = _gemm(program)
    assert (g.vec_a, g.vec_b, g.buffers) == (1, 1, 1)


def test_register_budget_bounds_the_micro_tile(tmp_path) -> None:
    path = _matmul(tmp_path / "mm.onnx", 128, 64, 128)
    few = _device(max_regs_per_thread=64)
    assert micro_budget(few).accumulators == 16
    g = _gemm(_program(path, few, tile=(32, 32)))  # 16 elements per thread of 64: tiled
    assert g.tm * g.tn == 16
    # 64 per thread: over the budget of 16, so the contraction keeps its per-element loop; a100 tiles it.
    assert not [g for k in _program(path, few, tile=(64, 64)).kernels for g in k.gemms]
    g = _gemm(_program(path, A100, tile=(64, 64)))
    assert g.tm * g.tn == 64


def test_vector_width_is_one_for_a_width_of_one(tmp_path) -> None:
    program = _program(_matmul(tmp_path / "mm.onnx", 64, 96, 64), A100)
    kernel = program.kernels[0]
    phase = next(p for s in kernel.segments for p in s.phases if p.gemm)
    assert vector_width(kernel, phase, "a", 1) == 1 and vector_width(kernel, phase, "a", 4) == 4
    assert vector_width(kernel, dataclasses.replace(phase, gemm=dataclasses.replace(phase.gemm, bk=6)), "a", 4) == 1


@pytest.mark.parametrize("m,k,n,tile,vec", [
    (64, 96, 64, (32, 32), (4, 4)),
    (37, 45, 29, (16, 8), (1, 1)),  # partial tiles in m, n and k; scalar staging
    (70, 100, 68, (32, 32), (4, 4)),  # partial tiles in m (6 rows), k (4 of 32) and n (4 columns)
])
def test_staged_gemm_under_cuda_sim_matches_numpy_and_the_count(tmp_path, m, k, n, tile, vec) -> None:
    """The printed kernel at its real launch: no findings (the two buffers never race), the product right,
    and the bytes its threads move equal to the kernel IR's count (the cost model's figures)."""
    from engine.codegen.count import count_kernel
    from engine.runtime.simt import run_simt

    path = _matmul(tmp_path / "mm.onnx", m, k, n)
    program = _program(path, A100, tile=tile)
    g = _gemm(program)
    assert (g.vec_a, g.vec_b, g.buffers) == (*vec, 2)
    graph = load_graph(path)
    a = np.random.default_rng(9).standard_normal((m, k)).astype(np.float32)
    outs, report = run_simt(program, graph.specs, {"a": a}, graph.weights)
    assert report.ok, "\n".join(report.summary_lines())
    want = a.astype(np.float64) @ graph.weights["B"].astype(np.float64)
    assert np.abs(outs["y"] - want).max() <= 1e-4 * np.abs(want).max()
    work, (got,) = count_kernel(program.kernels[0]), report.kernels
    assert (got.shared_load_bytes, got.shared_store_bytes) == (work.shared_load, work.shared_store)
    assert (got.global_load_bytes, got.global_store_bytes) == (work.global_load, work.global_store)


def test_the_c_target_of_a_gpu_plan_stages_element_by_element(tmp_path) -> None:
    path = _matmul(tmp_path / "mm.onnx", 64, 96, 64)
    graph = load_graph(path)
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", (32, 32), 64, 4)})
    (g,) = [g for k in generate(plan, graph, A100, target="c").kernels for g in k.gemms]
    assert (g.vec_a, g.vec_b, g.buffers) == (1, 1, 1)
