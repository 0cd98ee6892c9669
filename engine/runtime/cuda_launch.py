"""NVIDIA's cuda-python driver bindings (`cuda.bindings.driver`) in, a small GPU handle out: the primary
context made current on whichever thread calls, modules from CUBIN/PTX bytes, compiled resources and
occupancy per function, (cooperative) launches, device memory, and event timing of launches alone.

Shared by the CUDA executor (engine/runtime/cuda.py) and the bundle's standalone run_bundle.py, which
embeds the code below this docstring verbatim: keep it standard-library only, with no engine imports.
Every driver call's CUresult is checked; a failure is a one-line CudaError naming what was being done
(the kernel, for launches and faults) and the driver's error name and text.
"""

import ctypes
import statistics
import threading

SHARED_OPT_IN = 48 * 1024  # dynamic shared memory above this needs the per-function opt-in
# Linux driver branch that first ships each CUDA major's driver API (CUDA 13.0: 580.65.06).
DRIVER_BRANCH = {11: "R450", 12: "R525", 13: "R580"}
# What a failed call most likely means, and what to do about it.
_HINTS = {
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the driver is older than the compiler that made the PTX: update the driver",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "no binary in the module runs on this GPU: recompile with --arch for it",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": "the grid exceeds one resident wave",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "an out-of-bounds access; the context is lost, restart the process "
                                  "(tileweave run --backend cuda-sim finds the access without a GPU)",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many registers or threads for this launch",
    "CUDA_ERROR_INVALID_CONTEXT": "no context is current on this thread",
}


class CudaError(Exception):
    """A driver call failed, the driver is too old, or no device can run the request. One line."""

    def __init__(self, message):
        super().__init__(" ".join(str(message).split()))


def driver_text(version):
    """13000 -> "13.0" (cuDriverGetVersion's encoding: 1000 * major + 10 * minor)."""
    return f"{version // 1000}.{version % 1000 // 10}"


def driver_needed(nvrtc):
    """The CUDA driver version ("13.0" -> 13000) that loads what NVRTC `nvrtc` ("13.0") emits: its PTX ISA
    and its CUBINs need a driver of the same CUDA release or newer."""
    major, minor = (int(x) for x in str(nvrtc).split(".")[:2])
    return 1000 * major + 10 * minor


def driver_check(have, need):
    """None when a driver of version `have` runs code needing `need`, else the one-line reason and fix."""
    if have >= need:
        return None
    branch = DRIVER_BRANCH.get(need // 1000, f"for CUDA {driver_text(need)}")
    return (f"the NVIDIA driver supports CUDA {driver_text(have)} but these kernels were compiled by NVRTC "
            f"{driver_text(need)}, which needs a CUDA {driver_text(need)} driver: install driver {branch} or "
            f"newer (see docs/gpu.md)")


class Function:
    """A loaded kernel and what the compiler gave it (from cuFuncGetAttribute)."""

    def __init__(self, name, handle, module, registers, local_bytes, static_shared, max_threads):
        self.name, self.handle, self.module = name, handle, module
        self.registers, self.local_bytes = registers, local_bytes
        self.static_shared, self.max_threads = static_shared, max_threads
        self.dynamic_shared = 0  # the opt-in set so far (cuFuncSetAttribute)


class Gpu:
    """One device through `drv` (the cuda.bindings.driver module, or a test stand-in with the same
    names): its primary context, retained once and made current on every calling thread."""

    def __init__(self, drv, ordinal=0, need_driver=0):
        self.drv = drv
        self._call("cuInit", 0)
        self.driver_version = self._call("cuDriverGetVersion")
        reason = driver_check(self.driver_version, need_driver)
        if reason:
            raise CudaError(reason)
        count = self._call("cuDeviceGetCount")
        if count <= ordinal:
            raise CudaError(f"no CUDA device {ordinal}: the driver sees {count}")
        self.device = self._call("cuDeviceGet", ordinal)
        self.name = self._call("cuDeviceGetName", 256, self.device).split(b"\0", 1)[0].decode(errors="replace")
        attr = drv.CUdevice_attribute
        get = lambda a: self._call("cuDeviceGetAttribute", a, self.device)  # noqa: E731
        self.compute_capability = (get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                                   get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
        self.sm_count = get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.cooperative = bool(get(attr.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH))
        self.max_shared_optin = get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.context = self._call("cuDevicePrimaryCtxRetain", self.device)
        self._local = threading.local()  # per thread: its pair of timing events

    @property
    def arch(self):
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    # ---- driver calls ---------------------------------------------------------------------------
    def _call(self, name, *args, what=None):
        """drv.name(*args) with its CUresult checked; the remaining results (one value or a tuple)."""
        out = getattr(self.drv, name)(*args)
        result, rest = out[0], out[1:]
        if result != self.drv.CUresult.CUDA_SUCCESS:
            raise CudaError(f"{what or name} failed: {self.error_text(result)}")
        return rest[0] if len(rest) == 1 else rest

    def error_text(self, result):
        """'CUDA_ERROR_X (driver's text; what to do)' for a CUresult."""
        err, name = self.drv.cuGetErrorName(result)
        name = name.decode() if err == self.drv.CUresult.CUDA_SUCCESS and name else str(result)
        err, text = self.drv.cuGetErrorString(result)
        text = text.decode() if err == self.drv.CUresult.CUDA_SUCCESS and text else "no description"
        hint = _HINTS.get(name)
        return f"{name} ({text}{'; ' + hint if hint else ''})"

    def activate(self):
        """Make this device's primary context current on the calling thread (a Streamlit rerun, a
        worker thread): the driver keeps the current context per thread."""
        self._call("cuCtxSetCurrent", self.context)

    # ---- modules and functions ------------------------------------------------------------------
    def load_function(self, data, name):
        """Load one module from CUBIN or NUL-terminated PTX bytes and get kernel `name` from it."""
        self.activate()
        module = self._call("cuModuleLoadData", data, what=f"loading the module of kernel {name}")
        handle = self._call("cuModuleGetFunction", module, name.encode(),
                            what=f"finding kernel {name} in its module")
        attr = self.drv.CUfunction_attribute
        get = lambda a: self._call("cuFuncGetAttribute", a, handle, what=f"reading attributes of kernel {name}")  # noqa: E731
        return Function(name, handle, module, get(attr.CU_FUNC_ATTRIBUTE_NUM_REGS),
                        get(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES), get(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                        get(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK))

    def unload(self, fn):
        """Unload `fn`'s module (a long-lived process, such as the app, loads a program per run)."""
        self.activate()
        self._call("cuModuleUnload", fn.module, what=f"unloading the module of kernel {fn.name}")

    def allow_shared(self, fn, nbytes):
        """Opt `fn` in to `nbytes` of dynamic shared memory (needed above 48 KiB)."""
        if nbytes + fn.static_shared > self.max_shared_optin:
            raise CudaError(f"kernel {fn.name} needs {nbytes + fn.static_shared} B of shared memory per block, "
                            f"over the {self.max_shared_optin} B {self.name} allows: use a smaller tile")
        if nbytes > fn.dynamic_shared:
            self._call("cuFuncSetAttribute", fn.handle,
                       self.drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes,
                       what=f"opting kernel {fn.name} in to {nbytes} B of dynamic shared memory")
            fn.dynamic_shared = nbytes

    def resident_blocks(self, fn, threads, shared):
        """Blocks of `fn` resident per SM at `threads` threads and `shared` B of dynamic shared memory,
        as the driver computes it from the compiled registers (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        self.activate()
        if shared + fn.static_shared > SHARED_OPT_IN:
            self.allow_shared(fn, shared)
        return self._call("cuOccupancyMaxActiveBlocksPerMultiprocessor", fn.handle, threads, shared,
                          what=f"occupancy of kernel {fn.name}")

    # ---- launches and timing --------------------------------------------------------------------
    def launch(self, fn, grid, block, shared, pointers, cooperative=False):
        """One launch on the default stream; `pointers` are device addresses, one per kernel parameter.
        No cuCtxSetCurrent here (it would sit between the timing events): call it through
        `time_launches`, or after `activate()` on this thread."""
        params = (tuple(int(p) for p in pointers), tuple(ctypes.c_void_p for _ in pointers))
        if cooperative:
            self._call("cuLaunchCooperativeKernel", fn.handle, grid, 1, 1, block, 1, 1, shared, 0, params,
                       what=f"cooperative launch of kernel {fn.name} ({grid} blocks of {block})")
        else:
            self._call("cuLaunchKernel", fn.handle, grid, 1, 1, block, 1, 1, shared, 0, params, 0,
                       what=f"launch of kernel {fn.name} ({grid} blocks of {block})")

    def time_launches(self, name, run, repeat=1, warmup=1):
        """Median µs of `repeat` calls of `run()` (which launches), each between two events; `warmup`
        untimed calls first. Everything else (loading, attributes, copies) happens before. A fault
        surfaces at the synchronisation as one line naming kernel `name`."""
        self.activate()
        for _ in range(warmup):
            run()
        self._call("cuCtxSynchronize", what=f"kernel {name}")
        if getattr(self._local, "events", None) is None:
            flags = self.drv.CUevent_flags.CU_EVENT_DEFAULT
            self._local.events = (self._call("cuEventCreate", flags), self._call("cuEventCreate", flags))
        start, end = self._local.events
        samples = []
        for _ in range(max(1, repeat)):
            self._call("cuEventRecord", start, 0, what=f"timing kernel {name}")
            run()
            self._call("cuEventRecord", end, 0, what=f"timing kernel {name}")
            self._call("cuEventSynchronize", end, what=f"kernel {name}")
            samples.append(self._call("cuEventElapsedTime", start, end, what=f"timing kernel {name}") * 1e3)
        return statistics.median(samples), len(samples)

    # ---- memory ---------------------------------------------------------------------------------
    def alloc(self, nbytes):
        self.activate()
        return int(self._call("cuMemAlloc", max(int(nbytes), 1), what=f"allocating {nbytes} B of device memory"))

    def free(self, ptr):
        self._call("cuMemFree", ptr, what="freeing device memory")

    def upload(self, ptr, array):
        """Copy a C-contiguous NumPy array to device address `ptr`."""
        if array.nbytes:
            self._call("cuMemcpyHtoD", ptr, array.ctypes.data, array.nbytes, what="copying to the device")

    def download(self, array, ptr):
        """Copy device address `ptr` into a C-contiguous NumPy array."""
        if array.nbytes:
            self._call("cuMemcpyDtoH", array.ctypes.data, ptr, array.nbytes, what="copying from the device")

    def zero(self, ptr, nbytes):
        self._call("cuMemsetD8", ptr, 0, nbytes, what="clearing device memory")


_GPUS = {}
_GPUS_LOCK = threading.Lock()


def open_gpu(drv=None, ordinal=0, need_driver=0):
    """The process's Gpu for device `ordinal` (its primary context retained once), made current on the
    calling thread. `drv` defaults to cuda.bindings.driver; a missing driver library is a CudaError."""
    if drv is None:
        try:
            from cuda.bindings import driver as drv
        except ImportError as err:
            raise CudaError(f"cuda-python is not installed ({err}): pip install cuda-bindings") from None
    with _GPUS_LOCK:
        gpu = _GPUS.get((drv, ordinal))
        if gpu is None:
            try:
                gpu = Gpu(drv, ordinal, need_driver)
            except RuntimeError as err:  # cuda-bindings: "Failed to dlopen libcuda.so.1"
                raise CudaError(f"no CUDA device found: the NVIDIA driver library cannot be loaded ({err}); install "
                                "an NVIDIA driver (R580 or newer, see docs/gpu.md)") from None
            _GPUS[(drv, ordinal)] = gpu
    reason = driver_check(gpu.driver_version, need_driver)
    if reason:
        raise CudaError(reason)
    gpu.activate()
    return gpu
