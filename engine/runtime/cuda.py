"""CUDA backend: a Program in, its kernels compiled one by one with NVRTC for the attached GPU, one
module per kernel loaded through pycuda exactly as the bundle's run_cuda.py loads them (CUBIN for the
GPU's arch, else PTX), run in launch order; outputs and a Profile timed with CUDA events out.
Without a device or pycuda: BackendError from require_cuda(), never an ImportError."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import numpy as np

from engine.codegen.api import compile_program, compiled_files, program_json
from engine.codegen.kir import Program
from engine.errors import BackendError
from engine.profile.profile import KernelTime, Profile
from engine.runtime.cpu import bind_buffers
from engine.runtime.cuda_driver import require_cuda
from engine.runtime.cuda_modules import LoadError, arch_number, launch_kernel, load_kernels


def build_arch(device_arch: str, supported: tuple[str, ...]) -> str:
    """What to compile for a GPU of `device_arch`: itself when NVRTC emits CUBIN for it, else the newest
    older arch NVRTC knows (its PTX is JIT-compiled by the driver), else BackendError."""
    if device_arch in supported:
        return device_arch
    older = [a for a in supported if arch_number(a) <= arch_number(device_arch)]
    if not older:
        raise BackendError(f"this NVRTC cannot compile for {device_arch} or any older arch "
                           f"(it supports {', '.join(supported)})")
    return max(older, key=arch_number)


def load_program(drv, program: Program, device_arch: str) -> tuple[dict, dict]:
    """(program.json dict, {kernel: pycuda function}): compile per kernel and load one module each."""
    from engine.codegen.nvrtc import supported_archs

    compiled = compile_program(program, "cuda", archs=(build_arch(device_arch, supported_archs()),))
    files = compiled_files(program, compiled)
    meta = program_json(program, compiled, files)
    try:
        return meta, load_kernels(drv, meta, files.__getitem__, device_arch)
    except LoadError as err:
        raise BackendError(str(err)) from None


def run_cuda(program: Program, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
             weights: Mapping[str, np.ndarray], *, device: str = "a100",
             repeat: int = 1) -> tuple[dict[str, np.ndarray], Profile]:
    name = require_cuda()
    import pycuda.autoinit  # noqa: F401  (creates the context on device 0)
    import pycuda.driver as drv

    major, minor = drv.Device(0).compute_capability()
    meta, functions = load_program(drv, program, f"sm_{major}{minor}")
    host = bind_buffers(program, graph_specs, inputs, weights)
    dev = {}
    arena = drv.mem_alloc(max(program.memory.arena_bytes, 1))
    offsets = {a.tensor: a.offset for a in program.memory.allocations}
    for tensor, arr in host.items():
        if tensor in offsets:
            dev[tensor] = int(arena) + offsets[tensor]
        else:
            buf = drv.mem_alloc(max(arr.nbytes, 1))
            if tensor not in program.outputs:
                drv.memcpy_htod(buf, arr)
            dev[tensor] = buf
    times = []
    start, end = drv.Event(), drv.Event()
    for launch in meta["launches"]:
        fn = functions[launch["kernel"]]
        args = [np.uintp(int(dev[t])) for t in launch["args"]]
        samples = []
        for _ in range(max(1, repeat)):
            start.record()
            try:
                launch_kernel(drv, fn, launch, args)
            except LoadError as err:
                raise BackendError(str(err)) from None
            end.record()
            end.synchronize()
            samples.append(start.time_till(end) * 1e3)
        times.append(KernelTime(launch["kernel"], statistics.median(samples), len(samples)))
    outs = {}
    for onnx_name, tensor in zip(program.output_names, program.outputs):
        arr = np.empty_like(host[tensor])
        drv.memcpy_dtoh(arr, dev[tensor])
        outs[onnx_name] = arr
    return outs, Profile(f"measured on {name} (CUDA backend)", "cuda", tuple(times))
