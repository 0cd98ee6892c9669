"""Is a CUDA device usable here? Nothing in, (ok, device name or one-line reason) out; `attached_gpu()`
gives the Gpu (engine/runtime/cuda_launch.py) once the driver is known to load what our NVRTC emits.

Needs only the NVIDIA driver and the pinned pip packages (cuda-bindings, nvidia-cuda-nvrtc); the driver
library is opened on first use, so importing the engine never needs a GPU.
"""

from __future__ import annotations

from engine.errors import BackendError

NO_DEVICE = "no CUDA device found"


def required_driver() -> int:
    """The driver version (cuDriverGetVersion encoding, 13000 = CUDA 13.0) that loads this NVRTC's output."""
    from engine.codegen.nvrtc import nvrtc_version
    from engine.runtime.cuda_launch import driver_needed

    major, minor = nvrtc_version()
    return driver_needed(f"{major}.{minor}")


def attached_gpu(drv=None):
    """The Gpu for device 0, current on the calling thread; BackendError (one line) without one or with
    a driver older than the pinned NVRTC needs. `drv` replaces cuda.bindings.driver (tests)."""
    from engine.errors import CompileError
    from engine.runtime.cuda_launch import CudaError, open_gpu

    try:
        return open_gpu(drv, 0, required_driver())
    except CompileError as err:
        raise BackendError(f"{NO_DEVICE} usable: {err}") from None
    except CudaError as err:
        text = str(err)
        if "CUDA_ERROR_NO_DEVICE" in text or text.startswith(NO_DEVICE):
            raise BackendError(text if text.startswith(NO_DEVICE) else f"{NO_DEVICE} ({text})") from None
        raise BackendError(text) from None


def cuda_available(drv=None) -> tuple[bool, str]:
    """(True, name of device 0) or (False, why not, in one line). Never raises."""
    try:
        return True, attached_gpu(drv).name
    except BackendError as err:
        return False, str(err)
    except Exception as err:  # a broken install must not take the CPU backend down with it
        return False, f"{NO_DEVICE}: the CUDA driver bindings failed ({' '.join(str(err).split())})"


def require_cuda() -> str:
    """Name of device 0, or BackendError with the reason `cuda_available` gives."""
    ok, detail = cuda_available()
    if not ok:
        raise BackendError(detail)
    return detail
