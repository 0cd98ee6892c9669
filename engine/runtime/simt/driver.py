"""cuda-sim executor: a Program generated for target "cuda" and NumPy inputs in; every launch run by the
SIMT emulator on the printed CUDA source; outputs by ONNX name and a SimReport (findings, bytes moved) out."""

from __future__ import annotations

import ctypes
import dataclasses
import re
from collections.abc import Mapping

import numpy as np

from engine.codegen.api import kernel_units
from engine.codegen.kir import Kernel, MemoryPlan, Program
from engine.errors import BackendError
from engine.limits import call_bounded
from engine.runtime.simt import native
from engine.runtime.simt.memory import Memory, garbage, region_table, shared_regions, shift_of, smem_shift
from engine.runtime.simt.report import KINDS, Finding, KernelTraffic, SimReport

# A cooperative grid keeps every thread of every block alive at once (grid syncs need them all), so the
# emulator runs at most this many blocks of one; the printed tile loops (t += gridDim.x) cover the rest,
# as on a GPU whose resident wave is smaller than the tile count. 0 or None: the launch's own grid.
DEFAULT_GRID_CAP = 16
MAX_FINDINGS = 512


def program_units(program: Program) -> tuple[native.Unit, ...]:
    """The CUDA translation units the cuda backend compiles (one per kernel, KERNEL.cu)."""
    return tuple(native.Unit(f"{name}.cu", name, src) for name, src in kernel_units(program))


def run_simt(program: Program, specs: Mapping, inputs: Mapping[str, np.ndarray],
             weights: Mapping[str, np.ndarray], *, grid_cap: int | None = DEFAULT_GRID_CAP, resident: int = 1,
             plan=None, sources: Mapping[str, str] | None = None, time_limit: float | None = None,
             poll=None) -> tuple[dict[str, np.ndarray], SimReport]:
    """Run every launch of `program` (generated with target="cuda") under the emulator.

    `grid_cap` caps cooperative grids (see DEFAULT_GRID_CAP); `resident` is how many blocks of an ordinary
    launch are resident at once (blocks start as others finish, as on a GPU; any value is valid for code
    that does not wait on other blocks). `plan` (the Plan the program came from) adds each kernel's
    modeled traffic to the report. A launch that cannot finish (deadlock) stops the run there.
    `sources` (kernel name -> CUDA unit) runs edited units instead of the printed ones (a hand fix, or a
    deliberately broken kernel in the emulator's tests). With `time_limit` (seconds) or `poll`, building
    and emulating run in a worker process (engine/limits.py:call_bounded), killed when it outlives the
    limit (TimeLimitError) or when `poll` raises (a cancel)."""
    if time_limit is not None or poll is not None:
        return call_bounded(run_simt, program, specs, inputs, weights, grid_cap=grid_cap, resident=resident,
                            plan=plan, sources=sources, seconds=time_limit, poll=poll,
                            what=f"the cuda-sim run of {program.name}")
    if resident < 1:
        raise BackendError(f"cuda-sim: resident blocks must be at least 1, got {resident}")
    if grid_cap is not None and grid_cap < 0:
        raise BackendError(f"cuda-sim: the grid cap must be 0 (none) or positive, got {grid_cap}")
    units = program_units(program)
    if sources:
        unknown = sorted(set(sources) - {u.kernel for u in units})
        if unknown:
            raise BackendError(f"cuda-sim: no kernel {unknown[0]} in program {program.name}")
        units = tuple(native.Unit(u.file, u.kernel, sources.get(u.kernel, u.source)) for u in units)
    lib = native.build(units, program.name)
    mem = Memory()
    try:
        _bind(mem, program, specs, inputs, weights)
        findings, traffic, ran, stopped = _run_launches(lib, mem, program, grid_cap, resident)
        outs = {name: mem.arrays[t].copy() for name, t in zip(program.output_names, program.outputs)}
    finally:
        mem.close()
    modeled = {g.name: dict(g.cost.traffic_bytes) for g in plan.groups if g.cost} if plan is not None else {}
    kernels = tuple(KernelTraffic(k, *traffic[k], modeled=modeled.get(k, {})) for k in traffic)
    return outs, SimReport(tuple(findings), kernels, ran, stopped)


def _bind(mem: Memory, program: Program, specs: Mapping, inputs: Mapping[str, np.ndarray],
          weights: Mapping[str, np.ndarray]) -> None:
    """Inputs and weights: read-only and initialised (bounds checked only). Outputs and intermediates:
    shadowed and never written; intermediates alias in one arena laid out by the memory plan, so the
    arena's shadow is shared and each tensor's part is forgotten before its first launch."""
    from engine.runtime.cpu import bind_buffers

    plain = dataclasses.replace(program, memory=MemoryPlan((), 0, 0))
    env = bind_buffers(plain, specs, inputs, weights)  # checks the inputs (names, shapes) in one line
    for name in (*program.inputs, *program.constants):
        mem.add(name, env[name], tracked=False)
    placed = {a.tensor for a in program.memory.allocations}
    for name in program.outputs:
        if name not in placed and name not in mem.arrays:
            mem.add(name, garbage(specs[name].shape, specs[name].dtype.np), tracked=True)
    if not program.memory.allocations:
        return
    shift = min(shift_of(np.dtype(specs[a.tensor].dtype.np).itemsize) for a in program.memory.allocations)
    arena = garbage(max(program.memory.arena_bytes, 1), np.uint8)
    shadow = np.full((((arena.nbytes - 1) >> shift) + 1) * mem.cell, 0xFF, np.uint8)
    for a in program.memory.allocations:
        spec = specs[a.tensor]
        view = arena[a.offset:a.offset + a.nbytes].view(spec.dtype.np).reshape(spec.shape)
        mem.add(a.tensor, view, tracked=True, shadow=(shadow, a.offset >> shift), shift=shift)


def _run_launches(lib: native.SimLibrary, mem: Memory, program: Program, grid_cap: int | None, resident: int):
    first_use = {}
    for a in program.memory.allocations:
        first_use.setdefault(a.first, []).append(a.tensor)
    findings: list[Finding] = []
    traffic: dict[str, list[int]] = {}
    stopped, ran = "", 0
    for i, launch in enumerate(program.launches):
        for tensor in first_use.get(i, ()):
            mem.forget(tensor)
        kernel = program.kernel(launch.kernel)
        unit, entry = lib.entry(kernel.name)
        grid = launch.grid
        if launch.cooperative and grid_cap:
            grid = min(grid, grid_cap)
        args = (native.Arg * max(1, len(launch.args)))(*[mem.arg(t) for t in launch.args])
        rc, stats, found = launch_kernel(entry, args, kernel, unit, grid=grid, block=launch.block,
                                         smem=launch.shared_bytes, cooperative=launch.cooperative,
                                         resident=resident, regions=shared_regions(kernel, unit.lines),
                                         shift=smem_shift([kernel]), launch=i)
        ran += 1
        findings += found
        t = traffic.setdefault(kernel.name, [0, 0, 0, 0, 0])
        t[0] += 1
        for k in range(4):
            t[1 + k] += stats[k]
        if rc:
            stopped = f"launch {i} ({kernel.name}) could not finish; later launches did not run"
            break
    return findings, traffic, ran, stopped


def run_cuda_source(source: str, kernel: str, args: list[tuple[np.ndarray, str]], *, grid: int, block: int,
                    shared_bytes: int = 0, shared_granule: int = 4, cooperative: bool = False,
                    resident: int = 1, file: str = "kernel.cu") -> tuple[list[np.ndarray], SimReport]:
    """Run one hand-written CUDA kernel (all parameters pointers) under the emulator: how to check CUDA
    without a GPU. `args` in parameter order, each (array, mode): "in" read-only and initialised,
    "out" never written, "inout" initialised and written; findings name the parameters. The arrays are
    updated in place. `shared_granule`: the smallest element size kept in shared memory."""
    lib = native.build((native.Unit(file, kernel, source),), kernel)
    names = _param_names(source, kernel)
    if len(names) != len(args):
        raise BackendError(f"kernel {kernel} takes {len(names)} parameter(s), got {len(args)} argument(s)")
    mem = Memory()
    try:
        for name, (arr, mode) in zip(names, args):
            if mode not in ("in", "out", "inout") or not arr.flags.c_contiguous:
                raise BackendError(f"{name}: mode '{mode}' (in, out or inout) of a C-contiguous array")
            if mode == "out":
                arr.view(np.uint8).reshape(-1)[:] = 0xFF
            mem.add(name, arr, tracked=mode != "in", written=mode == "inout")
        argv = (native.Arg * max(1, len(args)))(*[mem.arg(name) for name in names])
        rc, stats, found = launch_kernel(lib.entries[0], argv, None, lib.units[0], grid=grid, block=block,
                                         smem=shared_bytes, cooperative=cooperative, resident=resident,
                                         regions=[], shift=shift_of(shared_granule))
    finally:
        mem.close()
    stopped = f"{kernel} could not finish" if rc else ""
    return [a for a, _ in args], SimReport(tuple(found), (KernelTraffic(kernel, 1, *stats),), 1, stopped)


def _param_names(source: str, kernel: str) -> list[str]:
    m = re.search(rf"\b{re.escape(kernel)}\s*\(([^)]*)\)", source)
    if m is None:
        raise BackendError(f"no kernel named {kernel} in the source")
    return [re.findall(r"\w+", p)[-1] for p in m[1].split(",") if p.strip()]


def launch_kernel(entry: int, args, kernel: Kernel | None, unit: native.Unit, *, grid: int, block: int, smem: int,
                  cooperative: bool, resident: int, regions, shift: int, launch: int = 0,
                  name: str | None = None) -> tuple[int, tuple[int, ...], list[Finding]]:
    """One launch through the runtime: (1 if it stopped, bytes [global load, global store, shared load,
    shared store], findings)."""
    rt = native.runtime()
    table, keep = region_table(regions)
    name = name or (kernel.name if kernel else unit.kernel)
    desc = native.LaunchDesc(entry=entry, args=ctypes.cast(args, ctypes.c_void_p), grid=(grid, 1, 1),
                             block=(block, 1, 1), smem_bytes=smem, smem_shift=shift, cooperative=int(cooperative),
                             resident=resident, nregions=len(regions), regions=ctypes.cast(table, ctypes.c_void_p),
                             kernel=name.encode())
    rc = rt.tw_launch(ctypes.byref(desc))
    del keep
    stats = (ctypes.c_uint64 * 4)()
    rt.tw_stats(stats)
    raw = (native.RawFinding * MAX_FINDINGS)()
    n = rt.tw_findings(raw, MAX_FINDINGS)
    lines = unit.lines
    found = [Finding(kind=KINDS[f.kind], kernel=name, file=unit.file, line=max(0, f.line),
                     source=lines[f.line - 1].strip() if 0 < f.line <= len(lines) else "",
                     block=tuple(f.block), thread=tuple(f.thread), buffer=f.buffer.decode(errors="replace"),
                     message=f.message.decode(errors="replace"), count=int(f.count), launch=launch)
             for f in raw[:n]]
    return rc, tuple(int(x) for x in stats), found
