"""CUDA backend: a Program in, its kernels compiled one by one with NVRTC for the attached GPU, one module
per kernel loaded through cuda-python exactly as the bundle's run_bundle.py loads them (CUBIN for the
GPU's arch, else PTX), run in launch order with the same launch rules; outputs and a Profile timed with
CUDA events around the launches alone out. Without a device: BackendError (one line), never an ImportError."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.codegen.api import compile_program, compiled_files, program_json
from engine.codegen.kir import Program
from engine.errors import BackendError
from engine.limits import call_bounded
from engine.profile.profile import KernelTime, Profile
from engine.runtime.cuda_driver import attached_gpu
from engine.runtime.cuda_launch import CudaError
from engine.runtime.cuda_modules import LoadError, arch_number, load_kernels, run_launches, time_program


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


def load_program(gpu, program: Program, device_arch: str) -> tuple[dict, dict]:
    """(program.json dict, {kernel: Function}): compile per kernel and load one module each."""
    from engine.codegen.nvrtc import supported_archs

    compiled = compile_program(program, "cuda", archs=(build_arch(device_arch, supported_archs()),))
    files = compiled_files(program, compiled)
    meta = program_json(program, compiled, files)
    try:
        return meta, load_kernels(gpu, meta, files.__getitem__, device_arch)
    except (LoadError, CudaError) as err:
        raise BackendError(str(err)) from None


def run_cuda(program: Program, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
             weights: Mapping[str, np.ndarray], *, device: str = "a100", repeat: int = 1,
             gpu=None, time_limit: float | None = None, poll=None,
             program_time: bool = False) -> tuple[dict[str, np.ndarray], Profile]:
    """Run `program` on the attached GPU (or `gpu`); outputs by ONNX output name and a measured Profile
    (per kernel: median of `repeat` launches after one warm-up launch; with `program_time` also the whole
    launch list run back to back `repeat` times, `Profile.program_us`). `device` names the preset the
    program was planned for; launches are sized for the GPU actually attached. With `time_limit`
    (seconds) or `poll`, compiling and running happen in a worker process with its own CUDA context
    (engine/limits.py:call_bounded), killed when it outlives the limit or when `poll` raises (a cancel)."""
    if gpu is None and (time_limit is not None or poll is not None):
        return call_bounded(run_cuda, program, graph_specs, inputs, weights, device=device, repeat=repeat,
                            program_time=program_time, seconds=time_limit, poll=poll,
                            what=f"the CUDA compile and run of {program.name}")
    gpu = gpu or attached_gpu()
    for name in program.inputs:
        _check_input(name, graph_specs[name], inputs)
    meta, functions = load_program(gpu, program, gpu.arch)
    tensors = {**{k: v for k, v in weights.items() if k in program.constants}, **inputs}
    try:
        outs, times = run_launches(gpu, meta, functions, tensors, repeat=repeat)
        whole = time_program(gpu, meta, functions, tensors, repeat=repeat) if program_time else None
        for fn in functions.values():
            gpu.unload(fn)
    except (LoadError, CudaError) as err:
        raise BackendError(str(err)) from None
    profile = Profile(f"measured on {gpu.name} (CUDA backend, planned for {device})", "cuda",
                      tuple(KernelTime(k, us, n) for k, us, n, _ in times), program_us=whole)
    return {onnx: outs[t] for onnx, t in zip(program.output_names, program.outputs)}, profile


def _check_input(name: str, spec, inputs: Mapping[str, np.ndarray]) -> None:
    from engine.errors import ShapeError

    if name not in inputs:
        raise ShapeError(f"missing input '{name}' (shape {list(spec.shape)})")
    if tuple(np.shape(inputs[name])) != tuple(spec.shape):
        raise ShapeError(f"input '{name}' has shape {list(np.shape(inputs[name]))}, expected {list(spec.shape)}")
