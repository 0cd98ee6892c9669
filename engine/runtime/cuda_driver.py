"""Is a CUDA device usable here? Nothing in, (ok, device name or one-line reason) out.

pycuda is optional (`pip install 'tileweave[gpu]'`) and imported only inside these functions, so
importing the engine never needs a GPU, a driver or pycuda.
"""

from __future__ import annotations

from engine.errors import BackendError

PYCUDA_MISSING = "pycuda is not installed: pip install 'tileweave[gpu]' (needs a CUDA driver)"
NO_DEVICE = "no CUDA device found"


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def cuda_available() -> tuple[bool, str]:
    """(True, name of device 0) or (False, why not, in one line). Never raises."""
    try:
        import pycuda.driver as drv
    except ModuleNotFoundError as err:
        if err.name is not None and err.name.split(".")[0] == "pycuda":
            return False, PYCUDA_MISSING
        return False, f"pycuda cannot be imported ({_one_line(err)}): reinstall it with pip install 'tileweave[gpu]'"
    except ImportError as err:
        # pycuda's extension links libcuda.so.1: without an NVIDIA driver its import fails here.
        return False, f"{NO_DEVICE}: pycuda cannot load the CUDA driver ({_one_line(err)}); install an NVIDIA driver"
    except Exception as err:  # a broken install must not take the CPU backend down with it
        return False, f"pycuda failed to import ({_one_line(err)}): reinstall it with pip install 'tileweave[gpu]'"
    try:
        drv.init()
        count = drv.Device.count()
        if count == 0:
            return False, NO_DEVICE
        return True, str(drv.Device(0).name())
    except Exception as err:  # pycuda._driver.Error and friends: cuInit fails without a device
        return False, f"{NO_DEVICE} ({_one_line(err)})"


def require_cuda() -> str:
    """Name of device 0, or BackendError with the reason `cuda_available` gives."""
    ok, detail = cuda_available()
    if not ok:
        raise BackendError(detail)
    return detail
