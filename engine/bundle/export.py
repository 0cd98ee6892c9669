"""Kernel bundle: everything a user takes away from a plan, as one zip.

In: a PrimGraph, its Plan and a device. Out: bytes of a zip holding the CUDA sources with PTX and
CUBIN per kernel and architecture, the C source, program.json (launch list, grids, buffers, arena), plan.json,
the rProgram trace (Perfetto), weights, a manifest with hashes and tool versions, and a standalone
`run_bundle.py` that runs the launch list on the CPU (the C source, NumPy + a C compiler) or on a GPU
(the CUBIN/PTX through cuda-python, with the CUDA executor's own launch rules).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass

from engine.device import Device, get_device
from engine.ir.graph import PrimGraph
from engine.runtime.npz import npz_bytes
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
    time_limit: float | None = None,
) -> bytes:
    """Generate, compile (NVRTC for every arch in `archs`) and pack the plan's kernels. `time_limit`
    (seconds) bounds the NVRTC compile (engine/codegen/api.py:compile_program): past it, TimeLimitError
    and nothing is written."""
    from engine.codegen.api import (
        CompiledProgram,
        compile_program,
        compiled_files,
        fit_launches,
        program_json,
    )
    from engine.codegen.ccompile import DEFAULT_OPTIONS as C_OPTIONS
    from engine.codegen.ccompile import LINK_LIBS
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

    compiled = compile_program(program, "cuda", archs=tuple(archs), time_limit=time_limit)
    program = fit_launches(program, compiled, device)  # cooperative grids at the compiled registers
    cuda_files = compiled_files(program, compiled)
    files = {f"cuda/{name}": data for name, data in cuda_files.items()}
    files["program.json"] = _json(program_json(program, compiled, cuda_files, prefix="cuda/"))
    c_program = generate(plan, graph, device, target="c")
    c_compiled = CompiledProgram("c", render_c(c_program))
    c_files = compiled_files(c_program, c_compiled)
    files.update({f"c/{name}": data for name, data in c_files.items()})
    files["c/program.json"] = _json(program_json(c_program, c_compiled, c_files, prefix="c/")
                                    | {"c_options": list(C_OPTIONS), "c_libs": list(LINK_LIBS)})
    files["plan.json"] = _json(plan_to_json(plan))
    files["trace.json"] = _json(trace)
    files["device.json"] = device.to_json().encode()
    if with_weights and graph.weights:
        files["weights.npz"] = npz_bytes(graph.weights, _ZIP_DATE)
    files["run_bundle.py"] = runner_source().encode()
    files["README.md"] = _readme(program, plan, device, archs).encode()
    files["manifest.json"] = _json(_manifest(program, plan, device, archs, files))
    return _zip(files)


def bundle_info(data: bytes) -> BundleInfo:
    """Read back a bundle's manifest (read_bundle checks entries and every file's hash: BundleError)."""
    from engine.bundle.read import read_bundle

    files = read_bundle(data)
    manifest = json.loads(files["manifest.json"])
    return BundleInfo(manifest["name"], tuple(files), manifest["kernels"], tuple(manifest["archs"]), len(data))


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
        "timings": "modeled (cost model); measure with run_bundle.py --backend cuda on a GPU",
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    }


def _readme(program, plan: Plan, device: Device, archs) -> str:
    rows = "\n".join(f"| {ln.kernel} | {ln.grid} | {ln.block} | {ln.shared_bytes} | {ln.cooperative} |"
                     for ln in program.launches)
    return f"""# {program.name}: tileweave kernel bundle

Policy `{plan.policy}` on device `{device.name}`; model hash `{plan.model_hash}`, plan hash `{plan.plan_hash}`.
Modeled program time {plan.modeled_us:.1f} µs (cost model, not measured).

- `cuda/{program.name}.cu` — the CUDA C of every kernel, for reading; `cuda/KERNEL.cu` — each kernel's own translation unit, compiled with NVRTC to `cuda/KERNEL.ARCH.ptx` and `cuda/KERNEL.ARCH.cubin` per arch ({", ".join(archs)}).
- `c/{program.name}.c` — the same kernels printed as C (OpenMP), as tileweave's CPU backend runs them, ending with `tw_program(void* const* tw_b)`, which makes every launch in order (`tw_b[i]` points at the i-th distinct tensor of the launch list's args, in order of first use); `c/program.json` — their launch list, buffers, arena and compiler options.
- `program.json` — launch list (kernel, source, per-arch PTX/CUBIN files with sha256 and compiled registers, grid, tiles, block, shared bytes, cooperative launch, args), buffers and the static arena.
- `plan.json` — the plan (edge connections, tiles, reasons); load it with `tileweave run --plan-in plan.json`.
- `trace.json` — the rProgram timeline; open it in https://ui.perfetto.dev.
- `weights.npz` — the model's constant tensors by name.
- `run_bundle.py` — runs the launch list without tileweave: `python run_bundle.py --inputs IN.npz --outputs OUT.npz --backend cpu` (NumPy and a C compiler with OpenMP) or `--backend cuda` (NumPy, `pip install cuda-bindings`, an NVIDIA driver for CUDA 13.0, i.e. R580 or newer). On a GPU a kernel with grid barriers is launched cooperatively with its grid capped to what the device keeps resident at its compiled registers, so the grids below may shrink.

| kernel | grid | block | shared B | cooperative |
|---|---|---|---|---|
{rows}
"""


def runner_source() -> str:
    """run_bundle.py: a header, then the code of engine/runtime/cuda_launch.py, cuda_modules.py (the
    launch layer the CUDA executor uses, so the two launch kernels the same way), npz.py and
    bundle/runner.py."""
    from engine.bundle import runner
    from engine.runtime import cuda_launch, cuda_modules, npz

    parts = [_RUNNER_HEAD]
    for module in (cuda_launch, cuda_modules, npz, runner):
        name = module.__name__.replace(".", "/") + ".py"
        parts.append(f"# ---- {name} (shared with tileweave) ----\n{_module_body(module)}")
    return "\n\n".join(parts) + '\n\nif __name__ == "__main__":\n    sys.exit(main())\n'


def _module_body(module) -> str:
    """A module's source without its docstring, `from __future__` and engine imports (whose names the
    runner defines itself, earlier in the file), located through the module's syntax tree."""
    import ast
    import inspect

    text = inspect.getsource(module)
    lines = text.splitlines()
    drop = set()
    for node in ast.parse(text).body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and \
            isinstance(node.value.value, str)
        if docstring or (isinstance(node, ast.ImportFrom) and node.module and
                         (node.module == "__future__" or node.module.split(".")[0] == "engine")):
            drop.update(range(node.lineno - 1, node.end_lineno))
    return "\n".join(line for k, line in enumerate(lines) if k not in drop).strip("\n")


_RUNNER_HEAD = '''"""Run this tileweave bundle without tileweave:

    python run_bundle.py --inputs IN.npz --outputs OUT.npz --backend {cpu,cuda}

cpu: NumPy and a C compiler with OpenMP (builds c/*.c into build/); cuda: NumPy, cuda-python
(pip install cuda-bindings) and an NVIDIA driver for the CUDA release in program.json ("nvrtc").
Generated by tileweave; the code below is tileweave's own launch layer, copied verbatim."""
import sys'''
