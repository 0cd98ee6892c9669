"""engine/runtime/cuda_launch.py on a stand-in for cuda.bindings.driver that defines only names the real
module has: context per thread, shared-memory opt-in, occupancy, cooperative launch, events around the
launches alone, one-line errors naming the kernel, the driver-version check."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from cuda.bindings import driver as real_driver
from fake_cuda import API_NAMES, FakeDriver

from engine.device import resident_blocks_per_sm
from engine.runtime.cuda_launch import SHARED_OPT_IN, CudaError, Gpu, driver_check, driver_needed, open_gpu
from engine.runtime.cuda_modules import prepare_launch

PTX = b".version 9.0\n.target sm_90\n.visible .entry k(\n.param .u64 a\n)\n{\nret;\n}\n\0"


def test_the_stand_in_only_defines_what_cuda_python_has():
    assert API_NAMES and all(hasattr(real_driver, name) for name in API_NAMES), \
        [n for n in API_NAMES if not hasattr(real_driver, n)]


def _gpu(**kw) -> tuple[Gpu, FakeDriver]:
    drv = FakeDriver(**kw)
    return open_gpu(drv, 0, 13000), drv


def test_open_reads_the_device_and_retains_its_primary_context_once():
    gpu, drv = _gpu(device="a100")
    assert (gpu.name, gpu.arch, gpu.sm_count, gpu.cooperative) == ("Fake A100", "sm_80", 108, True)
    assert open_gpu(drv, 0, 13000) is gpu
    assert len(drv.calls("cuDevicePrimaryCtxRetain")) == 1


def test_driver_older_than_nvrtc_output_is_one_line_with_the_fix():
    assert driver_needed("13.0") == 13000 and driver_needed("12.8") == 12080
    assert driver_check(13000, 13000) is None and driver_check(13020, 13000) is None
    with pytest.raises(CudaError) as info:
        open_gpu(FakeDriver(driver=12040), 0, 13000)
    msg = str(info.value)
    assert "\n" not in msg and "CUDA 12.4" in msg and "NVRTC 13.0" in msg and "R580" in msg


@pytest.mark.parametrize("shared, opted", [(1024, False), (SHARED_OPT_IN, False), (SHARED_OPT_IN + 16, True),
                                           (100 * 1024, True)])
def test_dynamic_shared_memory_is_opted_in_above_48k(shared, opted):
    gpu, drv = _gpu()
    fn = gpu.load_function(PTX, "k")
    p = prepare_launch(gpu, fn, {"kernel": "k", "grid": 10, "block": 128, "shared_bytes": shared,
                                 "cooperative": False})
    sets = drv.calls("cuFuncSetAttribute")
    assert bool(sets) == opted and p.grid == 10 and p.resident > 0
    if opted:
        assert sets[0][2][1] == real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        assert sets[0][2][2] == shared
    gpu.launch(fn, p.grid, p.block, p.shared, [gpu.alloc(4)])  # the stand-in refuses un-opted shared memory


def test_shared_memory_over_the_device_limit_is_refused_in_one_line():
    gpu, _ = _gpu(device="a100")
    fn = gpu.load_function(PTX, "k")
    with pytest.raises(CudaError, match="kernel k needs 200000 B of shared memory per block") as info:
        prepare_launch(gpu, fn, {"kernel": "k", "grid": 1, "block": 32, "shared_bytes": 200000, "cooperative": False})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("registers, threads, tiles", [(32, 256, 5000), (168, 256, 5000), (255, 256, 5000),
                                                       (32, 128, 40)])
def test_cooperative_grid_is_capped_by_the_drivers_occupancy_at_the_compiled_registers(registers, threads, tiles):
    gpu, drv = _gpu(device="h100", ptx_registers=registers)
    fn = gpu.load_function(PTX, "k")
    launch = {"kernel": "k", "grid": 999999, "tiles": tiles, "block": threads, "shared_bytes": 0, "cooperative": True}
    p = prepare_launch(gpu, fn, launch)
    occupancy = drv.calls("cuOccupancyMaxActiveBlocksPerMultiprocessor")[-1]
    assert occupancy[2][1:] == (threads, 0)
    assert p.resident == resident_blocks_per_sm(drv.preset, threads, registers, 0)[0]
    assert p.grid == min(tiles, p.resident * gpu.sm_count) and p.cooperative
    gpu.launch(fn, p.grid, p.block, p.shared, [gpu.alloc(4)], p.cooperative)  # the stand-in checks co-residency
    assert drv.calls("cuLaunchCooperativeKernel") and not drv.calls("cuLaunchKernel")
    # The registers are the ones the driver reports, not an estimate: more registers, fewer blocks.
    few, _ = _gpu(device="h100", ptx_registers=16)
    q = prepare_launch(few, few.load_function(PTX, "k"), launch)
    assert q.resident >= p.resident


def test_a_block_that_cannot_be_resident_is_refused_in_one_line():
    gpu, _ = _gpu(device="h100", ptx_registers=255)
    with pytest.raises(Exception, match="kernel k cannot be resident on Fake H100: 512 threads x 255 registers"):
        prepare_launch(gpu, gpu.load_function(PTX, "k"),
                       {"kernel": "k", "grid": 9, "block": 512, "shared_bytes": 0, "cooperative": True})


def test_plain_kernels_launch_normally_and_devices_without_cooperative_launch_refuse_barriers():
    gpu, drv = _gpu()
    fn = gpu.load_function(PTX, "k")
    p = prepare_launch(gpu, fn, {"kernel": "k", "grid": 7, "block": 64, "shared_bytes": 0, "cooperative": False})
    gpu.launch(fn, p.grid, p.block, p.shared, [gpu.alloc(4), gpu.alloc(8)], p.cooperative)
    name, _, args = drv.calls("cuLaunchKernel")[-1]
    assert (args[0], args[1], args[2]) == ("k", 7, 64) and len(args[4][0]) == 2
    nocoop, _ = _gpu(cooperative=False)
    with pytest.raises(Exception, match="does not support cooperative launch"):
        prepare_launch(nocoop, nocoop.load_function(PTX, "k"),
                       {"kernel": "k", "grid": 7, "block": 64, "shared_bytes": 0, "cooperative": True})


def test_a_fault_is_one_line_naming_the_kernel_and_the_drivers_error():
    gpu, drv = _gpu()
    fn = gpu.load_function(PTX, "k")
    drv.fail["cuCtxSynchronize"] = real_driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(CudaError) as info:
        gpu.time_launches("k03_softmax", lambda: gpu.launch(fn, 1, 32, 0, [gpu.alloc(4)]))
    msg = str(info.value)
    assert "\n" not in msg and "kernel k03_softmax" in msg and "CUDA_ERROR_ILLEGAL_ADDRESS" in msg
    assert "what CUDA_ERROR_ILLEGAL_ADDRESS means" in msg and "cuda-sim" in msg
    drv.fail = {"cuLaunchKernel": real_driver.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES}
    with pytest.raises(CudaError, match=r"launch of kernel k \(3 blocks of 1024\) failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        gpu.launch(fn, 3, 1024, 0, [])


def test_events_bracket_the_launches_only_after_a_warm_up():
    gpu, drv = _gpu()
    fn = gpu.load_function(PTX, "k")
    ptr = gpu.alloc(4)
    start = len(drv.log)
    us, runs = gpu.time_launches("k", lambda: gpu.launch(fn, 2, 32, 0, [ptr]), repeat=3, warmup=2)
    assert (us, runs) == (250.0, 3)
    names = [c[0] for c in drv.log[start:]]
    first = names.index("cuEventRecord")
    assert names[:first].count("cuLaunchKernel") == 2  # warm-up, untimed
    timed = names[first:]
    for k in range(3):  # record, launch, record, synchronize, elapsed: nothing else inside the pair
        assert timed[5 * k:5 * k + 5] == ["cuEventRecord", "cuLaunchKernel", "cuEventRecord", "cuEventSynchronize",
                                          "cuEventElapsedTime"]
    assert "cuModuleLoadData" not in names and "cuFuncGetAttribute" not in names


def test_a_second_thread_gets_the_context_made_current_before_it_calls():
    gpu, drv = _gpu()
    fn = gpu.load_function(PTX, "k")
    out = {}

    def worker():
        try:
            ptr = gpu.alloc(16)
            gpu.upload(ptr, np.arange(4, dtype=np.float32))
            out["us"] = gpu.time_launches("k", lambda: gpu.launch(fn, 1, 32, 0, [ptr]))
            back = np.empty(4, np.float32)
            gpu.download(back, ptr)
            out["back"] = back
        except Exception as err:  # surfaced below
            out["err"] = err

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert "err" not in out, out.get("err")
    assert np.array_equal(out["back"], np.arange(4, dtype=np.float32))
    assert any(c[0] == "cuCtxSetCurrent" and c[1] == t.ident for c in drv.log)
    # The stand-in is strict: without the context on that thread the driver call fails.
    bare = FakeDriver()
    res = {}
    th = threading.Thread(target=lambda: res.setdefault("r", bare.cuMemAlloc(4)[0]))
    th.start()
    th.join()
    assert res["r"] == real_driver.CUresult.CUDA_ERROR_INVALID_CONTEXT


def test_memory_round_trips_through_the_stand_in():
    gpu, _ = _gpu()
    data = np.random.default_rng(3).standard_normal(37).astype(np.float32)
    ptr = gpu.alloc(data.nbytes)
    gpu.upload(ptr, data)
    back = np.empty_like(data)
    gpu.download(back, ptr)
    assert np.array_equal(back, data)
    gpu.zero(ptr, data.nbytes)
    gpu.download(back, ptr)
    assert not back.any()
    assert ctypes.sizeof(ctypes.c_void_p) == 8
