"""Kernel bundle: everything a user takes away from a plan, as one zip.

In: a PrimGraph, its Plan and a device. Out: bytes of a zip holding the CUDA sources with PTX and
CUBIN per kernel and architecture, the C source, program.json (launch list, grids, buffers, arena), plan.json,
the rProgram trace (Perfetto), weights, a manifest with hashes and tool versions, and a standalone
`run_cuda.py` that loads one module per kernel with pycuda and runs the launch list on an attached GPU.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass

import numpy as np

from engine.device import Device, get_device
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Plan, plan_to_json

DEFAULT_ARCHS = ("sm_80", "sm_90")
# Fixed timestamp so the same plan gives byte-identical bundles.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class BundleInfo:
    name: str
    files: tuple[str, ...]
    kernels: int
    archs: tuple[str, ...]
    nbytes: int


def export_bundle(
    graph: PrimGraph,
    plan: Plan,
    device: Device | str = "a100",
    *,
    archs: tuple[str, ...] = DEFAULT_ARCHS,
    with_weights: bool = True,
    trace: dict | None = None,
) -> bytes:
    """Generate, compile (NVRTC for every arch in `archs`) and pack the plan's kernels."""
    from engine.codegen.api import compile_program, compiled_files, program_json
    from engine.codegen.generate import generate
    from engine.codegen.targets import render_c
    from engine.runtime.execute import check_plan

    device = get_device(device) if isinstance(device, str) else device
    check_plan(plan, graph, device.name)
    program = generate(plan, graph, device)
    if trace is None:
        from engine.rprogram.trace import export_trace
        from engine.rprogram.wavefront import build_rprogram

        trace = export_trace(build_rprogram(plan, device))

    compiled = compile_program(program, "cuda", archs=tuple(archs))
    cuda_files = compiled_files(program, compiled)
    files = {f"cuda/{name}": data for name, data in cuda_files.items()}
    files[f"c/{program.name}.c"] = render_c(generate(plan, graph, device, target="c")).encode()
    files["program.json"] = _json(program_json(program, compiled, cuda_files, prefix="cuda/"))
    files["plan.json"] = _json(plan_to_json(plan))
    files["trace.json"] = _json(trace)
    files["device.json"] = device.to_json().encode()
    if with_weights and graph.weights:
        buf = io.BytesIO()
        np.savez(buf, **{name: np.ascontiguousarray(v) for name, v in graph.weights.items()})
        files["weights.npz"] = buf.getvalue()
    files["run_cuda.py"] = runner_source().encode()
    files["README.md"] = _readme(program, plan, device, archs).encode()
    files["manifest.json"] = _json(_manifest(program, plan, device, archs, files))
    return _zip(files)


def bundle_info(data: bytes) -> BundleInfo:
    """Read back a bundle's manifest (and check every file's hash)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        manifest = json.loads(z.read("manifest.json"))
        for name, digest in manifest["sha256"].items():
            if hashlib.sha256(z.read(name)).hexdigest() != digest:
                raise ValueError(f"bundle file {name} does not match its manifest hash")
        return BundleInfo(manifest["name"], tuple(z.namelist()), manifest["kernels"],
                          tuple(manifest["archs"]), len(data))


def _json(obj) -> bytes:
    return json.dumps(obj, indent=1, sort_keys=True).encode()


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, files[name])
    return buf.getvalue()


def _manifest(program, plan: Plan, device: Device, archs, files: dict[str, bytes]) -> dict:
    from engine import __version__
    from engine.codegen.nvrtc import nvrtc_version

    return {
        "name": program.name, "tileweave": __version__, "nvrtc": ".".join(map(str, nvrtc_version())),
        "model_hash": plan.model_hash, "plan_hash": plan.plan_hash, "policy": plan.policy,
        "device": device.name, "archs": list(archs), "kernels": len(program.kernels),
        "launches": len(program.launches), "modeled_us": round(plan.modeled_us, 3),
        "timings": "modeled (cost model); measure with run_cuda.py on a GPU",
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    }


def _readme(program, plan: Plan, device: Device, archs) -> str:
    rows = "\n".join(f"| {ln.kernel} | {ln.grid} | {ln.block} | {ln.shared_bytes} | {ln.cooperative} |"
                     for ln in program.launches)
    return f"""# {program.name}: tileweave kernel bundle

Policy `{plan.policy}` on device `{device.name}`; model hash `{plan.model_hash}`, plan hash `{plan.plan_hash}`.
Modeled program time {plan.modeled_us:.1f} µs (cost model, not measured).

- `cuda/{program.name}.cu` — the CUDA C of every kernel, for reading; `cuda/KERNEL.cu` — each kernel's own translation unit, compiled with NVRTC to `cuda/KERNEL.ARCH.ptx` and `cuda/KERNEL.ARCH.cubin` per arch ({", ".join(archs)}).
- `c/*.c` — the same kernels printed as C (OpenMP), as tileweave's CPU backend runs them.
- `program.json` — launch list (kernel, source, per-arch PTX/CUBIN files with sha256, grid, block, shared bytes, cooperative launch, args), buffers and the static arena.
- `plan.json` — the plan (edge connections, tiles, reasons); load it with `tileweave run --plan-in plan.json`.
- `trace.json` — the rProgram timeline; open it in https://ui.perfetto.dev.
- `weights.npz` — the model's constant tensors by name.
- `run_cuda.py` — runs the launch list on a GPU with pycuda: `python run_cuda.py inputs.npz outputs.npz`.

| kernel | grid | block | shared B | cooperative |
|---|---|---|---|---|
{rows}
"""


def runner_source() -> str:
    """run_cuda.py: a header, engine/runtime/cuda_modules.py's code (the loader the CUDA executor uses,
    so the two load kernels the same way) and the runner's main."""
    import ast
    import inspect

    from engine.runtime import cuda_modules

    text = inspect.getsource(cuda_modules)
    body = "\n".join(text.splitlines()[ast.parse(text).body[0].end_lineno:])  # drop its docstring
    return _RUNNER_HEAD + "\n# ---- engine/runtime/cuda_modules.py (shared with tileweave's CUDA executor) ----\n" + \
        body.strip("\n") + "\n\n" + _RUNNER_MAIN


# A standalone runner: reads program.json, loads one module per kernel (the CUBIN for the GPU's arch, else
# PTX), allocates every tensor, launches in order (cooperative launches for kernels with grid barriers)
# and writes the outputs.
_RUNNER_HEAD = '''"""Run this bundle's kernels on a CUDA GPU: python run_cuda.py inputs.npz outputs.npz (needs pycuda)."""
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

'''

_RUNNER_MAIN = '''
def main(argv):
    if len(argv) != 2:
        print("usage: python run_cuda.py inputs.npz outputs.npz", file=sys.stderr)
        return 2
    try:
        import pycuda.autoinit  # noqa: F401
        import pycuda.driver as cuda
    except Exception as err:  # no pycuda or no device: say so in one line
        print(f"error: pycuda with a CUDA device is needed ({' '.join(str(err).split())})", file=sys.stderr)
        return 2
    prog = json.loads((HERE / "program.json").read_text())
    major, minor = cuda.Device(0).compute_capability()
    try:
        functions = load_kernels(cuda, prog, lambda name: (HERE / name).read_bytes(), f"sm_{major}{minor}")
    except LoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tensors = dict(np.load(argv[0]))
    weights = HERE / "weights.npz"
    if weights.exists():
        tensors.update(dict(np.load(weights)))
    device = {}
    for buf in prog["buffers"]:
        name, shape, dtype = buf["tensor"], tuple(buf["shape"]), np.dtype(buf["dtype"])
        host = np.ascontiguousarray(tensors[name], dtype=dtype) if name in tensors else np.empty(shape, dtype)
        device[name] = cuda.to_device(host)
    start, end = cuda.Event(), cuda.Event()
    start.record()
    for ln in prog["launches"]:
        args = [np.uintp(int(device[a])) for a in ln["args"]]
        try:
            launch_kernel(cuda, functions[ln["kernel"]], ln, args)
        except LoadError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    end.record()
    end.synchronize()
    print(f"{len(prog['launches'])} launches in {start.time_till(end) * 1e3:.1f} us (measured, CUDA events)")
    shapes = {b["tensor"]: (tuple(b["shape"]), np.dtype(b["dtype"])) for b in prog["buffers"]}
    outs = {}
    for tensor, name in zip(prog["outputs"], prog["output_names"]):
        shape, dtype = shapes[tensor]
        outs[name] = cuda.from_device(device[tensor], shape, dtype)
    np.savez(argv[1], **outs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''
