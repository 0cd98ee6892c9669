"""The bundle's standalone runner: `python run_bundle.py --inputs IN.npz --outputs OUT.npz --backend
{cpu,cuda}` in the unpacked bundle; outputs by ONNX name in OUT.npz and per-kernel times out.

run_bundle.py is this module's code after engine/runtime/cuda_launch.py's and cuda_modules.py's (the
CUDA executor's own launch layer) and npz.py's (the .npz reader the CLI uses too), with the docstrings and engine imports left out: it needs NumPy and
a C compiler with OpenMP (cpu: the bundle's C source built with the engine's options), or cuda-python
and an NVIDIA driver (cuda: the launch rules of the engine). Keep it standard library + NumPy.
"""

import argparse
import ctypes
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.runtime.cuda_launch import CudaError, driver_needed, open_gpu
from engine.runtime.cuda_modules import LoadError, host_array, load_kernels, run_launches
from engine.runtime.npz import npz_bytes, read_npz_arrays


class BundleError(Exception):
    """Bad arguments or files, or a missing compiler: one line."""


def read_tensors(path):
    try:
        return read_npz_arrays(path)
    except (OSError, ValueError) as err:
        raise BundleError(f"cannot read {path} as .npz ({' '.join(str(err).split())})") from None


def bind_host(program, tensors):
    """Every tensor a C launch touches -> a C-contiguous array: inputs and constants checked against
    program.json, outputs and unplanned tensors their own arrays, intermediates views of one arena at
    their planned offsets (as engine/runtime/cpu.py binds them)."""
    env = {}
    arena = np.empty(max(program["memory"]["arena_bytes"], 1), dtype=np.uint8)
    for buf in program["buffers"]:
        name, dtype, shape = buf["tensor"], np.dtype(buf["dtype"]), tuple(buf["shape"])
        if name in program["inputs"] or name in program["constants"]:
            env[name] = host_array(buf, tensors)
        elif buf.get("offset") is not None and buf["role"] == "intermediate":
            env[name] = arena[buf["offset"]:buf["offset"] + buf["nbytes"]].view(dtype).reshape(shape)
        else:
            env[name] = np.empty(shape, dtype)
    return env


def find_compiler():
    """$CC (may carry arguments), else cc, else gcc."""
    env = os.environ.get("CC", "").strip()
    cmd = shlex.split(env) if env else [c for c in ("cc", "gcc") if shutil.which(c)][:1]
    if not cmd or shutil.which(cmd[0]) is None:
        raise BundleError("no C compiler found: install gcc with OpenMP (apt-get install gcc) or set CC")
    return cmd


def build_library(here, program):
    """Compile the bundle's C source with the options tileweave's CPU backend uses (plus -march=native
    where the compiler takes it), cached under build/ by source and options; the loaded library."""
    cmd = find_compiler()
    source = here / program["source"]
    options = list(program["c_options"])
    probe = subprocess.run([*cmd, "-march=native", "-x", "c", "-fsyntax-only", "-"], input="int x;\n",
                           capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        options.append("-march=native")
    key = hashlib.sha256(json.dumps([source.read_text(), options, cmd]).encode()).hexdigest()[:16]
    folder = here / "build"
    try:
        folder.mkdir(exist_ok=True)
        probe_file = folder / ".writable"
        probe_file.touch()
    except OSError:  # a read-only bundle folder: build in a temporary one
        folder = Path(tempfile.mkdtemp(prefix="tileweave-bundle-"))
    lib = folder / f"{source.stem}-{key}.so"
    if not lib.exists():
        tmp = folder / f".{lib.name}.{os.getpid()}.tmp"
        argv = [*cmd, *options, str(source), "-o", str(tmp), *program["c_libs"]]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            first = next((ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln), "no output")
            raise BundleError(f"the C source failed to compile: {first.strip()}; reproduce: {shlex.join(argv)}")
        os.replace(tmp, lib)
    return ctypes.CDLL(str(lib))


def run_cpu(here, program, tensors, repeat):
    """Run c/program.json's launch list through the compiled C source; (outputs, [(kernel, µs, runs)])."""
    lib = build_library(here, program)
    env = bind_host(program, tensors)
    times = []
    for ln in program["launches"]:
        fn = getattr(lib, ln["kernel"])
        fn.restype, fn.argtypes = None, [ctypes.c_void_p] * len(ln["args"])
        args = [env[t].ctypes.data for t in ln["args"]]
        samples = []
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            fn(*args)
            samples.append((time.perf_counter() - t0) * 1e6)
        times.append((ln["kernel"], sorted(samples)[len(samples) // 2], len(samples)))
    return {name: env[name].copy() for name in program["outputs"]}, times


def run_gpu(here, program, tensors, repeat):
    """Run program.json's launch list on device 0 with the engine's launch rules; (outputs, times)."""
    gpu = open_gpu(None, 0, driver_needed(program["nvrtc"]))
    functions = load_kernels(gpu, program, lambda name: (here / name).read_bytes(), gpu.arch)
    outs, times = run_launches(gpu, program, functions, tensors, repeat=repeat)
    print(f"device: {gpu.name} ({gpu.arch}, driver CUDA {gpu.driver_version // 1000}."
          f"{gpu.driver_version % 1000 // 10})")
    for kernel, _, _, prepared in times:
        print(f"  {kernel}: grid {prepared.grid} ({prepared.why})")
    return outs, [(k, us, n) for k, us, n, _ in times]


def main(argv=None, here=None):
    parser = argparse.ArgumentParser(prog="run_bundle.py", description="Run this tileweave bundle's kernels: "
                                     "--backend cpu builds c/*.c with the system C compiler (OpenMP); "
                                     "--backend cuda loads cuda/*.cubin|ptx with cuda-python on GPU 0.")
    parser.add_argument("--inputs", required=True, help="input tensors by ONNX input name (.npz)")
    parser.add_argument("--outputs", required=True, help="where to write the outputs by ONNX output name (.npz)")
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cuda", help="default cuda")
    parser.add_argument("--repeat", type=int, default=1, help="launches timed per kernel (median)")
    args = parser.parse_args(argv)
    here = Path(here or Path(__file__).resolve().parent)
    try:
        meta = json.loads((here / ("c/program.json" if args.backend == "cpu" else "program.json")).read_text())
        tensors = {}
        if (here / "weights.npz").exists():
            tensors.update(read_tensors(here / "weights.npz"))
        tensors.update(read_tensors(args.inputs))
        run = run_cpu if args.backend == "cpu" else run_gpu
        outs, times = run(here, meta, tensors, args.repeat)
        Path(args.outputs).write_bytes(npz_bytes({name: outs[t] for t, name in zip(meta["outputs"], meta["output_names"])}))
    except (BundleError, LoadError, CudaError, OSError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    total = sum(us for _, us, _ in times)
    clock = "CUDA events" if args.backend == "cuda" else "wall clock"
    print(f"{len(times)} launches, {total:.1f} us (measured, {clock}, median of {max(1, args.repeat)}) -> "
          f"{args.outputs}")
    for kernel, us, _ in times:
        print(f"  {kernel}: {us:.1f} us")
    return 0
