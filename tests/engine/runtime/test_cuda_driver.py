"""Tests for engine/runtime/cuda_driver.py: reasons, never ImportError, with and without pycuda."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from engine.errors import BackendError
from engine.runtime import cuda_driver
from engine.runtime.cuda_driver import NO_DEVICE, PYCUDA_MISSING, cuda_available, require_cuda


def _fake_pycuda(monkeypatch, *, count: int = 1, init_error: Exception | None = None) -> None:
    """Install a stand-in pycuda.driver so the device paths run without a GPU."""
    driver = types.ModuleType("pycuda.driver")

    def init() -> None:
        if init_error is not None:
            raise init_error

    class Device:
        def __init__(self, index: int) -> None:
            self.index = index

        @staticmethod
        def count() -> int:
            return count

        def name(self) -> str:
            return "NVIDIA H100 80GB HBM3"

    driver.init = init
    driver.Device = Device
    package = types.ModuleType("pycuda")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)


@pytest.mark.skipif(importlib.util.find_spec("pycuda") is not None, reason="pycuda is installed here")
def test_this_machine_has_no_cuda() -> None:
    ok, reason = cuda_available()
    assert ok is False
    assert reason == PYCUDA_MISSING
    with pytest.raises(BackendError) as info:
        require_cuda()
    assert str(info.value) == PYCUDA_MISSING


def test_missing_pycuda_is_a_reason_not_an_import_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pycuda", None)  # makes `import pycuda` raise ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "pycuda.driver", raising=False)
    assert cuda_available() == (False, PYCUDA_MISSING)
    with pytest.raises(BackendError, match="pip install 'tileweave\\[gpu\\]'"):
        require_cuda()


def test_no_device_when_cuinit_fails(monkeypatch) -> None:
    _fake_pycuda(monkeypatch, init_error=RuntimeError("cuInit failed:\n no CUDA-capable device is detected"))
    ok, reason = cuda_available()
    assert not ok and reason.startswith(NO_DEVICE) and "\n" not in reason
    with pytest.raises(BackendError, match=NO_DEVICE):
        require_cuda()


def test_no_device_when_count_is_zero(monkeypatch) -> None:
    _fake_pycuda(monkeypatch, count=0)
    assert cuda_available() == (False, NO_DEVICE)


def test_device_found(monkeypatch) -> None:
    _fake_pycuda(monkeypatch)
    assert cuda_available() == (True, "NVIDIA H100 80GB HBM3")
    assert require_cuda() == "NVIDIA H100 80GB HBM3"


def test_module_does_not_import_pycuda() -> None:
    source = open(cuda_driver.__file__).read()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not any("pycuda" in line for line in top_level)
