"""A stand-in for `cuda.bindings.driver` (a helper module, not a conftest) for tests without a GPU.

It defines only functions the real module has, with the real signatures' argument order and result
tuples, and uses the real enums (`API_NAMES` is checked against the installed package by the tests).
It keeps the current context per thread (a call without one fails with CUDA_ERROR_INVALID_CONTEXT,
as the driver does), device memory as bytes, registers read from the loaded CUBIN, occupancy from
`resident_blocks_per_sm` for a preset, and a log of every call with its thread.
"""

from __future__ import annotations

import ctypes
import threading

from cuda.bindings import driver as real

from engine.codegen.cubin import cubin_resources
from engine.device import get_device, resident_blocks_per_sm

OK = real.CUresult.CUDA_SUCCESS
NEEDS_CONTEXT = {"cuModuleLoadData", "cuModuleUnload", "cuOccupancyMaxActiveBlocksPerMultiprocessor", "cuLaunchKernel",
                 "cuLaunchCooperativeKernel", "cuCtxSynchronize", "cuEventCreate", "cuEventRecord",
                 "cuEventSynchronize", "cuMemAlloc", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemsetD8", "cuMemFree"}


class FakeDriver:
    CUresult = real.CUresult
    CUdevice_attribute = real.CUdevice_attribute
    CUfunction_attribute = real.CUfunction_attribute
    CUevent_flags = real.CUevent_flags

    def __init__(self, *, device: str = "h100", driver: int = 13000, cooperative: bool = True,
                 ptx_registers: int = 32, fail: dict | None = None) -> None:
        self.preset = get_device(device)
        self.driver, self.cooperative, self.ptx_registers = driver, cooperative, ptx_registers
        self.fail = dict(fail or {})  # function name -> CUresult it returns instead of success
        self.log: list[tuple[str, int, tuple]] = []
        self.memory: dict[int, bytearray] = {}  # live allocations
        self.freed: dict[int, bytearray] = {}  # kept, so a test can read what a finished run left
        self.functions: dict[int, dict] = {}
        self.modules: dict[int, bytes] = {}
        self.unloaded: list[int] = []
        self._tls = threading.local()
        self._next = 0x1000

    # ---- bookkeeping -------------------------------------------------------------------------
    def _enter(self, name: str, *args):
        self.log.append((name, threading.get_ident(), args))
        if name in self.fail:
            return self.fail[name]
        if name in NEEDS_CONTEXT and getattr(self._tls, "ctx", None) is None:
            return real.CUresult.CUDA_ERROR_INVALID_CONTEXT
        return OK

    def _handle(self) -> int:
        self._next += 0x1000
        return self._next

    def calls(self, name: str | None = None) -> list[tuple[str, int, tuple]]:
        return [c for c in self.log if name is None or c[0] == name]

    def bytes_at(self, ptr: int, nbytes: int) -> bytes:
        both = {**self.freed, **self.memory}
        base = max(b for b in both if b <= ptr)
        return bytes(both[base][ptr - base:ptr - base + nbytes])

    # ---- device and context --------------------------------------------------------------------
    def cuInit(self, flags):
        return (self._enter("cuInit", flags),)

    def cuDriverGetVersion(self):
        return self._enter("cuDriverGetVersion"), self.driver

    def cuDeviceGetCount(self):
        return self._enter("cuDeviceGetCount"), 1

    def cuDeviceGet(self, ordinal):
        return self._enter("cuDeviceGet", ordinal), ordinal

    def cuDeviceGetName(self, length, dev):
        return self._enter("cuDeviceGetName", length, dev), f"Fake {self.preset.name.upper()}".encode().ljust(length, b"\0")

    def cuDeviceGetAttribute(self, attrib, dev):
        a = real.CUdevice_attribute
        value = {a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: self.preset.compute_capability[0],
                 a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: self.preset.compute_capability[1],
                 a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: self.preset.sm_count,
                 a.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: int(self.cooperative),
                 a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: self.preset.max_smem_per_block_bytes}[attrib]
        return self._enter("cuDeviceGetAttribute", attrib, dev), value

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._enter("cuDevicePrimaryCtxRetain", dev), 0xC0

    def cuCtxSetCurrent(self, ctx):
        result = self._enter("cuCtxSetCurrent", ctx)
        if result == OK:
            self._tls.ctx = ctx
        return (result,)

    def cuCtxSynchronize(self):
        return (self._enter("cuCtxSynchronize"),)

    def cuGetErrorName(self, error):
        return OK, error.name.encode()

    def cuGetErrorString(self, error):
        return OK, f"what {error.name} means".encode()

    # ---- modules ------------------------------------------------------------------------------
    def cuModuleLoadData(self, image):
        result = self._enter("cuModuleLoadData", bytes(image[:8]))
        handle = self._handle()
        self.modules[handle] = bytes(image)
        return result, handle

    def cuModuleUnload(self, hmod):
        result = self._enter("cuModuleUnload", hmod)
        self.unloaded.append(hmod)
        return (result,)

    def cuModuleGetFunction(self, hmod, name):
        result = self._enter("cuModuleGetFunction", hmod, name)
        data, text = self.modules[hmod], name.decode()
        if data[:4] == b"\x7fELF":
            found = cubin_resources(data).get(text)
            regs = found.registers if found else None
        else:
            regs = self.ptx_registers if f".entry {text}(".encode() in data else None
        if regs is None:
            return real.CUresult.CUDA_ERROR_NOT_FOUND, None
        handle = self._handle()
        self.functions[handle] = {"name": text, "registers": regs, "max_dynamic": 48 * 1024}
        return result, handle

    def cuFuncGetAttribute(self, attrib, hfunc):
        a, fn = real.CUfunction_attribute, self.functions[hfunc]
        value = {a.CU_FUNC_ATTRIBUTE_NUM_REGS: fn["registers"], a.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: 0,
                 a.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: 0,
                 a.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: self.preset.max_threads_per_block}[attrib]
        return self._enter("cuFuncGetAttribute", attrib, hfunc), value

    def cuFuncSetAttribute(self, hfunc, attrib, value):
        result = self._enter("cuFuncSetAttribute", hfunc, attrib, value)
        if attrib == real.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            self.functions[hfunc]["max_dynamic"] = value
        return (result,)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func, blockSize, dynamicSMemSize):
        result = self._enter("cuOccupancyMaxActiveBlocksPerMultiprocessor", func, blockSize, dynamicSMemSize)
        fn = self.functions[func]
        if dynamicSMemSize > fn["max_dynamic"]:
            return result, 0  # what the driver answers for shared memory the function was not opted in to
        blocks, _ = resident_blocks_per_sm(self.preset, blockSize, fn["registers"], dynamicSMemSize)
        return result, blocks

    # ---- launches and events ------------------------------------------------------------------
    def _check_launch(self, f, grid, block, shared, params) -> None:
        values, types = params
        assert isinstance(values, tuple) and isinstance(types, tuple) and len(values) == len(types)
        assert all(isinstance(v, int) for v in values) and all(t is ctypes.c_void_p for t in types)
        assert shared <= self.functions[f]["max_dynamic"], "launch above the opted-in shared memory"

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams, extra):
        result = self._enter("cuLaunchKernel", self.functions[f]["name"], gx, bx, sharedMemBytes, kernelParams)
        self._check_launch(f, gx, bx, sharedMemBytes, kernelParams)
        return (result,)

    def cuLaunchCooperativeKernel(self, f, gx, gy, gz, bx, by, bz, sharedMemBytes, hStream, kernelParams):
        result = self._enter("cuLaunchCooperativeKernel", self.functions[f]["name"], gx, bx, sharedMemBytes,
                             kernelParams)
        self._check_launch(f, gx, bx, sharedMemBytes, kernelParams)
        per_sm, _ = resident_blocks_per_sm(self.preset, bx, self.functions[f]["registers"], sharedMemBytes)
        if result == OK and gx > per_sm * self.preset.sm_count:
            return (real.CUresult.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,)
        return (result,)

    def cuEventCreate(self, flags):
        return self._enter("cuEventCreate", flags), self._handle()

    def cuEventRecord(self, hEvent, hStream):
        return (self._enter("cuEventRecord", hEvent),)

    def cuEventSynchronize(self, hEvent):
        return (self._enter("cuEventSynchronize", hEvent),)

    def cuEventElapsedTime(self, hStart, hEnd):
        return self._enter("cuEventElapsedTime"), 0.25

    # ---- memory -------------------------------------------------------------------------------
    def cuMemAlloc(self, bytesize):
        result = self._enter("cuMemAlloc", bytesize)
        ptr = self._handle() << 20
        self.memory[ptr] = bytearray(bytesize)
        return result, ptr

    def cuMemFree(self, dptr):
        result = self._enter("cuMemFree", dptr)
        self.freed[int(dptr)] = self.memory.pop(int(dptr))
        return (result,)

    def cuMemcpyHtoD(self, dstDevice, srcHost, ByteCount):
        result = self._enter("cuMemcpyHtoD", dstDevice, ByteCount)
        base = max(b for b in self.memory if b <= dstDevice)
        self.memory[base][dstDevice - base:dstDevice - base + ByteCount] = ctypes.string_at(srcHost, ByteCount)
        return (result,)

    def cuMemcpyDtoH(self, dstHost, srcDevice, ByteCount):
        result = self._enter("cuMemcpyDtoH", srcDevice, ByteCount)
        ctypes.memmove(dstHost, self.bytes_at(srcDevice, ByteCount), ByteCount)
        return (result,)

    def cuMemsetD8(self, dstDevice, uc, N):
        result = self._enter("cuMemsetD8", dstDevice, uc, N)
        base = max(b for b in self.memory if b <= dstDevice)
        self.memory[base][dstDevice - base:dstDevice - base + N] = bytes([uc]) * N
        return (result,)


API_NAMES = sorted(n for n in vars(FakeDriver) if n.startswith(("cu", "CU")))
