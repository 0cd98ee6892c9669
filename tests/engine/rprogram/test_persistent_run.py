"""engine/rprogram/persistent_run.py: the CUDA persistent kernel's launcher on the stand-in driver
(tests/fake_cuda.py): compiled for the device, grid from the driver's occupancy at the compiled
registers (vEUs folded onto it), a cooperative launch of `buf`, zeroed `done` and the folded `sched`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeDriver

from engine.codegen.generate import generate
from engine.device import get_device, resident_blocks_per_sm
from engine.errors import BackendError
from engine.frontend.importer import load_graph
from engine.rprogram.persistent import persistent_cuda, persistent_schedule
from engine.rprogram.persistent_run import run_persistent_cuda
from engine.rprogram.wavefront import build_rprogram, plan_for_rprogram
from engine.runtime.cuda_launch import open_gpu
from engine.schedule.policies import make_plan

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
A100 = get_device("a100")


@pytest.fixture(scope="module")
def vit():
    graph = load_graph(SAMPLES / "vit_block.onnx")
    plan = make_plan(graph, "welder", A100)
    rp = build_rprogram(plan, A100, graph=graph)
    plan = plan_for_rprogram(plan, rp, graph, A100)
    return graph, generate(plan, graph, A100), rp


def test_launcher_sizes_the_grid_from_occupancy_and_folds_the_veus(vit):
    graph, program, rp = vit
    drv = FakeDriver(device="a100")
    # The stand-in reports the occupancy of an A100 with half its register file, where the compiled kernel
    # holds fewer blocks per SM than the rProgram's vEUs assume (on a full A100 it fits them all).
    drv.preset = dataclasses.replace(drv.preset, regs_per_sm=drv.preset.regs_per_sm // 2)
    gpu = open_gpu(drv, 0, 13000)
    rng = np.random.default_rng(11)
    feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype.np) for t in graph.inputs}
    outs, run = run_persistent_cuda(program, rp, graph, feeds, gpu=gpu, repeat=2)
    assert set(outs) == set(graph.output_names) and run.runs == 2
    src = persistent_cuda(program, rp)
    fn = next(f for f in drv.functions.values() if f["name"] == "tw_persistent")
    per_sm, _ = resident_blocks_per_sm(drv.preset, src.block, fn["registers"], src.shared_bytes)
    assert run.registers == fn["registers"] and run.resident_per_sm == per_sm
    assert run.grid == min(rp.vdevice.veus, per_sm * A100.sm_count) < rp.vdevice.veus  # folded
    assert "folded" in run.why
    launches = drv.calls("cuLaunchCooperativeKernel")
    assert len(launches) == 3 and not drv.calls("cuLaunchKernel")  # warm-up + 2 timed, all cooperative
    _, _, (name, grid, block, shared, (ptrs, _)) = launches[-1]
    assert (name, grid, block, shared) == ("tw_persistent", run.grid, src.block, src.shared_bytes)
    buf, done, sched = ptrs
    want = persistent_schedule(rp, run.grid)
    assert np.frombuffer(drv.bytes_at(sched, want.nbytes), np.int32).tolist() == want.tolist()
    assert drv.bytes_at(done, 4 * src.counters) == bytes(4 * src.counters)
    table = np.frombuffer(drv.bytes_at(buf, 8 * len(src.tensors)), np.uint64)
    x = src.tensors.index(graph.inputs[0].name)
    got = np.frombuffer(drv.bytes_at(int(table[x]), feeds[graph.inputs[0].name].nbytes), np.float32)
    assert np.array_equal(got, feeds[graph.inputs[0].name].ravel())  # buf[i] points at tensor i's data
    assert not drv.memory and drv.unloaded == list(drv.modules)  # every allocation freed, the module unloaded


def test_a_persistent_block_that_cannot_be_resident_is_refused_in_one_line(vit):
    graph, program, rp = vit
    drv = FakeDriver(device="a100")
    drv.cuOccupancyMaxActiveBlocksPerMultiprocessor = lambda func, b, s: (drv.CUresult.CUDA_SUCCESS, 0)
    rng = np.random.default_rng(12)
    feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype.np) for t in graph.inputs}
    with pytest.raises(BackendError, match="cannot be resident on Fake A100") as info:
        run_persistent_cuda(program, rp, graph, feeds, gpu=open_gpu(drv, 0, 13000))
    assert "\n" not in str(info.value)
