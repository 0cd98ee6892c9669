"""OpenCL backend: a Program printed by the OpenCL printer (engine/codegen/opencl.py), built for the first
OpenCL device found (a GPU before a CPU; here PoCL's CPU device) through pyopencl, run launch by launch
in program order; outputs and a Profile timed with OpenCL profiling events around each launch.

A kernel with grid barriers runs as its segments' kernels one after another on the same grid (OpenCL
has no grid barrier). Without pyopencl or an OpenCL platform: a one-line BackendError saying what to
install, never an ImportError.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

import numpy as np

from engine.codegen.kir import Program
from engine.errors import BackendError, CompileError
from engine.profile.profile import KernelTime, Profile
from engine.runtime.cpu import bind_buffers

INSTALL_HINT = ("install an OpenCL driver and pyopencl: on Debian `apt-get install pocl-opencl-icd` (runs "
                "OpenCL on the CPU) and `pip install pyopencl`")


def opencl_device():
    """(pyopencl module, the device to run on): the first GPU of any platform, else the first device."""
    try:
        import pyopencl as cl
    except ImportError:
        raise BackendError("the OpenCL backend needs pyopencl, which is not installed", hint=INSTALL_HINT) from None
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as err:
        raise BackendError(f"no OpenCL platform is available ({str(err).splitlines()[0]})",
                           hint=INSTALL_HINT) from None
    if not devices:
        raise BackendError("no OpenCL device is available", hint=INSTALL_HINT)
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return cl, (gpus or devices)[0]


def build_options(device) -> list[str]:
    """PoCL 3.1 (LLVM 15, Debian 12) miscompiles some of our kernels with optimisations on: decoder_kv's
    welder attention kernel read its staged GEMM tiles as zeros (7e-2 off), correct with
    `-cl-opt-disable`, correct again when unrelated stores were added — while the same CUDA program runs
    clean under cuda-sim. So on PoCL kernels build unoptimised: the OpenCL backend here proves the printer,
    its timings are not a target. Other drivers get the default build."""
    platform = f"{device.platform.name} {device.platform.version}".lower()
    return ["-cl-opt-disable"] if "pocl" in platform or "portable computing language" in platform else []


def build_opencl(program: Program):
    """(pyopencl, context, device, built program, source) for `program` printed as OpenCL C."""
    from engine.codegen.opencl import render_opencl

    cl, device = opencl_device()
    source = render_opencl(program)
    ctx = cl.Context([device])
    try:
        built = cl.Program(ctx, source).build(options=build_options(device))
    except cl.Error as err:
        lines = [x for x in str(err).splitlines() if "error" in x.lower()] or str(err).splitlines()
        raise CompileError(f"OpenCL build of {program.name} failed on {device.name.strip()}: {lines[0].strip()}",
                           hint="DEBUG=4 prints the source; please report it") from None
    return cl, ctx, device, built, source


def run_opencl(program: Program, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
               weights: Mapping[str, np.ndarray], *, repeat: int = 1) -> tuple[dict[str, np.ndarray], Profile]:
    """Run `program` on the OpenCL device; outputs by ONNX output name and a Profile (per kernel: median
    of `repeat` launches after one warm-up launch, from the launches' profiling events)."""
    from engine.codegen.opencl import needs_shared, segment_kernels

    host = bind_buffers(program, graph_specs, inputs, weights)
    cl, ctx, device, built, _ = build_opencl(program)
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    mf = cl.mem_flags
    bufs = {name: cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=arr) if arr.nbytes else
            cl.Buffer(ctx, mf.READ_WRITE, 4) for name, arr in host.items()}
    local_limit = device.local_mem_size
    steps = []  # per launch: [(kernel object, global size, local size)]
    for ln in program.launches:
        parts = []
        for part in segment_kernels(program.kernel(ln.kernel)):
            if part.shared_bytes > local_limit:
                raise BackendError(f"{part.name} needs {part.shared_bytes} B of local memory; "
                                   f"{device.name.strip()} has {local_limit} B", hint="plan with smaller tiles")
            fn = getattr(built, part.name)
            args = [bufs[t] for t in ln.args]
            if needs_shared(part):
                args.append(cl.LocalMemory(max(part.shared_bytes, 16)))
            fn.set_args(*args)
            parts.append((fn, (ln.grid * ln.block,), (ln.block,)))
        steps.append((ln.kernel, parts))
    times = []
    try:
        for name, parts in steps:
            samples = []
            for k in range(max(1, repeat) + 1):
                events = [cl.enqueue_nd_range_kernel(queue, fn, g, loc) for fn, g, loc in parts]
                events[-1].wait()
                if k:  # the first launch warms up
                    samples.append((events[-1].profile.end - events[0].profile.start) / 1e3)
            times.append(KernelTime(name, statistics.median(samples), len(samples)))
        outs = {}
        for onnx_name, t in zip(program.output_names, program.outputs):
            arr = np.empty_like(host[t])
            cl.enqueue_copy(queue, arr, bufs[t])
            outs[onnx_name] = arr
        queue.finish()
    except cl.Error as err:
        raise BackendError(f"OpenCL run of {program.name} failed: {str(err).splitlines()[0]}") from None
    label = f"measured on {device.name.strip()} (OpenCL backend, planned for {program.device})"
    return outs, Profile(label, "opencl", tuple(times))
