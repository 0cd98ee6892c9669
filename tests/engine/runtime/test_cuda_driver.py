"""Tests for engine/runtime/cuda_driver.py: reasons in one line, never an ImportError or a traceback;
the driver version checked against what the pinned NVRTC emits."""

from __future__ import annotations

import pytest
from cuda.bindings import driver as real_driver
from fake_cuda import FakeDriver

from engine.errors import BackendError
from engine.runtime import cuda_driver
from engine.runtime.cuda_driver import NO_DEVICE, attached_gpu, cuda_available, require_cuda, required_driver


def test_this_machine_has_no_cuda_and_says_so_in_one_line() -> None:
    ok, reason = cuda_available()
    if ok:
        pytest.skip("a CUDA device is attached")
    assert reason.startswith(NO_DEVICE) and "\n" not in reason
    with pytest.raises(BackendError) as info:
        require_cuda()
    assert str(info.value) == reason


def test_the_pinned_nvrtc_needs_a_cuda_13_driver() -> None:
    assert required_driver() == 13000


def test_device_found_through_the_driver_bindings() -> None:
    assert cuda_available(FakeDriver(device="h100")) == (True, "Fake H100")
    assert attached_gpu(FakeDriver(device="a100")).arch == "sm_80"


def test_no_device_when_cuinit_fails() -> None:
    drv = FakeDriver(fail={"cuInit": real_driver.CUresult.CUDA_ERROR_NO_DEVICE})
    ok, reason = cuda_available(drv)
    assert not ok and reason.startswith(NO_DEVICE) and "CUDA_ERROR_NO_DEVICE" in reason and "\n" not in reason


def test_an_old_driver_is_refused_with_the_fix() -> None:
    ok, reason = cuda_available(FakeDriver(driver=12080))
    assert not ok and "CUDA 12.8" in reason and "R580" in reason and "\n" not in reason


def test_module_does_not_import_the_bindings_at_import_time() -> None:
    source = open(cuda_driver.__file__).read()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not any("cuda" in line.split()[1] for line in top_level)
