"""CUDA backend: a Program in, its CUDA source compiled with NVRTC for the attached GPU, run through
pycuda (cooperative launch for kernels with grid barriers), outputs and a Profile timed with CUDA
events out. Without a device or pycuda: BackendError from require_cuda(), never an ImportError."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import numpy as np

from engine.codegen.kir import Program
from engine.codegen.nvrtc import compile_cuda
from engine.codegen.targets import render_cuda
from engine.errors import BackendError
from engine.profile.profile import KernelTime, Profile
from engine.runtime.cpu import bind_buffers
from engine.runtime.cuda_driver import require_cuda


def run_cuda(program: Program, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
             weights: Mapping[str, np.ndarray], *, device: str = "a100",
             repeat: int = 1) -> tuple[dict[str, np.ndarray], Profile]:
    name = require_cuda()
    import pycuda.autoinit  # noqa: F401  (creates the context on device 0)
    import pycuda.driver as drv

    major, minor = drv.Device(0).compute_capability()
    binary = compile_cuda(render_cuda(program), name=program.name, arch=f"sm_{major}{minor}")
    module = drv.module_from_buffer(binary.cubin)
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
    for launch in program.launches:
        fn = module.get_function(launch.kernel)
        args = [np.uintp(int(dev[t])) for t in launch.args]
        samples = []
        for _ in range(max(1, repeat)):
            start.record()
            if launch.cooperative:
                _launch_cooperative(drv, fn, launch, args)
            else:
                fn(*args, block=(launch.block, 1, 1), grid=(launch.grid, 1))
            end.record()
            end.synchronize()
            samples.append(start.time_till(end) * 1e3)
        times.append(KernelTime(launch.kernel, statistics.median(samples), len(samples)))
    outs = {}
    for onnx_name, tensor in zip(program.output_names, program.outputs):
        arr = np.empty_like(host[tensor])
        drv.memcpy_dtoh(arr, dev[tensor])
        outs[onnx_name] = arr
    return outs, Profile(f"measured on {name} (CUDA backend)", "cuda", tuple(times))


def _launch_cooperative(drv, fn, launch, args) -> None:
    """cuLaunchCooperativeKernel: needed for cg::this_grid().sync(); the grid is one resident wave."""
    # Not every pycuda exposes cuLaunchCooperativeKernel; look it up instead of assuming (untested: no GPU here).
    coop = getattr(drv, "launch_cooperative_kernel", None)
    if coop is None:
        raise BackendError(f"kernel {launch.kernel} needs a cooperative launch, which this pycuda does not "
                           "expose: upgrade pycuda (pip install -U 'tileweave[gpu]')")
    coop(fn, (launch.grid, 1, 1), (launch.block, 1, 1), args)
