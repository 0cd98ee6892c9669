"""Tensor cores for tiled GEMMs: a Kernel and a Device in, the Kernel with each GEMM that can run on the
device's tensor cores set to mma.sync (`use_tensor_cores`: Kernel -> Kernel, parameters in Gemm.mma /
warps_m / warps_n), under the plan option `tf32` (TF32 rounds fp32 operands to 10 mantissa bits).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from engine.codegen.kexpr import strip
from engine.codegen.kir import Gemm, Kernel, Scope
from engine.device import Device
from engine.ir import expr as E
from engine.ir.dtypes import DType

MMA_TF32 = "m16n8k8.tf32"  # mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
MMA_M, MMA_N, MMA_K = 16, 8, 8
WARP = 32

_TF32: ContextVar[bool] = ContextVar("tf32", default=False)


def tf32_allowed() -> bool:
    """Whether fp32 contractions may run on TF32 tensor cores: the plan option `tf32` in force."""
    return _TF32.get()


@contextmanager
def tensor_core_options(options: Mapping | None) -> Iterator[None]:
    """Plan, cost and generate under the plan's `tf32` option (default off: fp32 stays exact fp32 FMA)."""
    token = _TF32.set(bool((options or {}).get("tf32", False)))
    try:
        yield
    finally:
        _TF32.reset(token)


def use_tensor_cores(kernel: Kernel, device: Device, tf32: bool | None = None) -> Kernel:
    """`kernel` with every tiled GEMM that fits whole m16n8k8 tiles on TF32 tensor cores, where `device`
    has them and either `tf32` (default: the option in force) allows rounding fp32 operands, or both
    factors are fp16 loads (exact in TF32's 10-bit mantissa and 8-bit exponent). Edge tiles need no
    mask: the staging zero-fills past the tile's live rows, columns and k, and the epilogue stores only
    live elements. A GEMM whose padded tile, k step or threads are not whole mma tiles and warps keeps
    the FMA micro-tile."""
    if not kernel.gemms or "tf32" not in device.tensor_precisions:
        return kernel
    allowed = tf32_allowed() if tf32 is None else tf32
    segments, changed = [], False
    for seg in kernel.segments:
        phases = []
        for p in seg.phases:
            if p.gemm is not None and (allowed or _exact_in_tf32(kernel, p.gemm)):
                grid = warp_grid(p.gemm, kernel.threads)
                if grid is not None:
                    p = dataclasses.replace(p, gemm=dataclasses.replace(
                        p.gemm, mma=MMA_TF32, warps_m=grid[0], warps_n=grid[1]))
                    changed = True
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    return dataclasses.replace(kernel, segments=tuple(segments)) if changed else kernel


def warp_grid(g: Gemm, threads: int) -> tuple[int, int] | None:
    """(warps_m, warps_n): the tx*ty micro-tile threads as whole warps on a grid over the padded block
    tile's m16 x n8 tiles, each warp owning an equal block of them, the most nearly square warp tile
    (fewest fragment loads per mma); None when the tile, k step or threads do not divide."""
    pm, pn, n = g.ty * g.tm, g.tx * g.tn, g.tx * g.ty
    if not pm or not pn or pm % MMA_M or pn % MMA_N or g.bk % MMA_K or n % WARP or n > threads:
        return None
    warps, mt, nt = n // WARP, pm // MMA_M, pn // MMA_N
    best = None
    for wm in range(1, warps + 1):
        wn = warps // wm
        if warps % wm or mt % wm or nt % wn:
            continue
        shape = abs((mt // wm) * MMA_M - (nt // wn) * MMA_N)
        if best is None or shape < best[0]:
            best = (shape, wm, wn)
    return None if best is None else (best[1], best[2])


def _exact_in_tf32(kernel: Kernel, g: Gemm) -> bool:
    """Both factors are plain loads of fp16 tensors: TF32 holds every fp16 value exactly."""
    for factor in (g.a, g.b):
        e = strip(factor, {})
        if not isinstance(e, E.Load) or e.dtype != DType.F16:
            return False
        try:
            if kernel.buffer(e.tensor).scope != Scope.GLOBAL:
                return False
        except KeyError:
            return False
    return True


def fma_only(kernel: Kernel) -> Kernel:
    """`kernel` with every GEMM on the FMA micro-tile (what printers without tensor cores run)."""
    if not any(g.mma for g in kernel.gemms):
        return kernel
    return dataclasses.replace(kernel, segments=tuple(dataclasses.replace(s, phases=tuple(
        dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, mma="", warps_m=0, warps_n=0)) if p.gemm else p
        for p in s.phases)) for s in kernel.segments))
