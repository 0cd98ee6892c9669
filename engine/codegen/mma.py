"""Tensor cores for tiled GEMMs: a Kernel and a Device in, the Kernel with each GEMM that can run on the
device's tensor cores set to mma.sync (`use_tensor_cores`: Kernel -> Kernel, parameters in Gemm.mma /
warps_m / warps_n): fp16 x fp16 products as m16n8k16 .f16, bf16 x bf16 ones as m16n8k16 .bf16 (both
fp32 accumulate; the same fragment layout), fp32 ones as m16n8k8 .tf32
under the plan option `tf32` (TF32 rounds fp32 operands to 10 mantissa bits).
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
MMA_F16 = "m16n8k16.f16"  # mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
MMA_BF16 = "m16n8k16.bf16"  # mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA 9.7.14.5.8 layout)
MMA_M, MMA_N, MMA_K = 16, 8, 8
MMA_K_F16 = 16
WARP = 32
# m16n8k16 with .f16 operands needs sm_80; Volta's fp16 tensor cores take only mma.m8n8k4 (its quad-pair
# fragments are another layout we do not print), so a V100 keeps fp16 products on the FMA micro-tile.
F16_MMA_CAPABILITY = (8, 0)

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
    """`kernel` with its tiled GEMMs on the device's tensor cores, where whole mma tiles and warps cover
    the padded block tile and k step (`warp_grid`):
    - m16n8k16 .f16 (Gemm.mma MMA_F16, staged as fp16) where both factors are fp16 in the graph (loads
      of fp16 tensors, or values the graph types fp16: a fused LayerNorm's output is staged rounded to
      fp16, as the unfused graph stores it) and the device has fp16 tensor cores taking that shape
      (`f16_mma`);
    - m16n8k16 .bf16 (MMA_BF16, staged as bf16) the same way where both factors are bf16 in the graph
      and the device has bf16 tensor cores (`bf16_mma`: sm_80 on; a V100 has none);
    - else m16n8k8 .tf32 where the device has TF32 and either `tf32` (default: the option in force)
      allows rounding fp32 operands, or both factors are plain fp16 or bf16 loads (exact in TF32's
      10-bit mantissa and 8-bit exponent).
    Edge tiles need no mask: the staging zero-fills past the tile's live rows, columns and k, and the
    epilogue stores only live elements. Any other GEMM keeps the FMA micro-tile."""
    if not kernel.gemms:
        return kernel
    half, bf16, has_tf32 = f16_mma(device), bf16_mma(device), "tf32" in device.tensor_precisions
    if not half and not bf16 and not has_tf32:
        return kernel
    allowed = tf32_allowed() if tf32 is None else tf32
    segments, changed = [], False
    for seg in kernel.segments:
        phases = []
        for p in seg.phases:
            g, grid = p.gemm, None
            if g is not None and half and _fp16_typed(g):
                kind, grid = MMA_F16, warp_grid(g, kernel.threads, MMA_K_F16)
            if g is not None and bf16 and _typed(g, DType.BF16):
                kind, grid = MMA_BF16, warp_grid(g, kernel.threads, MMA_K_F16)
            if g is not None and grid is None and has_tf32 and (allowed or _fp16_loads(kernel, g)):
                kind, grid = MMA_TF32, warp_grid(g, kernel.threads, MMA_K)
            if grid is not None:
                p = dataclasses.replace(p, gemm=dataclasses.replace(g, mma=kind, warps_m=grid[0], warps_n=grid[1]))
                changed = True
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    return dataclasses.replace(kernel, segments=tuple(segments)) if changed else kernel


def f16_mma(device: Device) -> bool:
    """Whether `device` runs mma.sync m16n8k16 with fp16 operands (fp16 tensor cores, sm_80 or later)."""
    return "fp16" in device.tensor_precisions and tuple(device.compute_capability) >= F16_MMA_CAPABILITY


def bf16_mma(device: Device) -> bool:
    """Whether `device` runs mma.sync m16n8k16 with bf16 operands (bf16 tensor cores: sm_80 or later)."""
    return "bf16" in device.tensor_precisions and tuple(device.compute_capability) >= F16_MMA_CAPABILITY


def warp_grid(g: Gemm, threads: int, mma_k: int = MMA_K) -> tuple[int, int] | None:
    """(warps_m, warps_n): the tx*ty micro-tile threads as whole warps on a grid over the padded block
    tile's m16 x n8 tiles, each warp owning an equal block of them, the most nearly square warp tile
    (fewest fragment loads per mma); None when the tile, k step (a multiple of `mma_k`) or threads do
    not divide."""
    pm, pn, n = g.ty * g.tm, g.tx * g.tn, g.tx * g.ty
    if not pm or not pn or pm % MMA_M or pn % MMA_N or g.bk % mma_k or n % WARP or n > threads:
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


def _fp16_typed(g: Gemm) -> bool:
    """Both factors are fp16 values in the graph (their expressions' dtype)."""
    return _typed(g, DType.F16)


def _typed(g: Gemm, dtype: DType) -> bool:
    """Both factors are `dtype` values in the graph (their expressions' dtype)."""
    return all(strip(f, {}).dtype == dtype for f in (g.a, g.b))


def _fp16_loads(kernel: Kernel, g: Gemm) -> bool:
    """Both factors are plain loads of global fp16 or bf16 tensors: TF32 holds each such value exactly."""
    for factor in (g.a, g.b):
        e = strip(factor, {})
        if not isinstance(e, E.Load) or e.dtype not in (DType.F16, DType.BF16):
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
