"""GEMM micro-kernel parameters from the device: a Device in, the register and shared-memory budgets the
tile mapping works within (`micro_budget`) out; and the kernel pass that sets each tiled GEMM's staging
(vector width per factor, one or two staging buffers) from the device (`stage_gemms`: Kernel -> Kernel).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.codegen.kexpr import strip
from engine.codegen.kir import Kernel, Phase, Region, Scope
from engine.device import Device, resident_blocks_per_sm
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType

BASE_REGS = 24  # indices, pointers, loop counters of any generated kernel (cost.BASE_REGS)
C_STAGE_BYTES = 48 * 1024  # a C block's staging arrays (its stack): the budget the C GEMM was tuned for


@dataclass(frozen=True)
class MicroBudget:
    """What one thread block's GEMM may use on a device."""

    accumulators: int  # fp32 accumulators per thread: tm * tn at most
    stage_bytes: int  # A + B staging of one k step (one buffer each)
    vector: int  # fp32 elements per staging load (1: scalar)
    double_buffer: bool  # staging may be double-buffered


def micro_budget(device: Device) -> MicroBudget:
    """The largest power-of-two accumulator count whose micro-tile (tm*tn accumulators, tm + tn operand
    fragments, about 2*sqrt(tm*tn)) fits the thread's registers beside the kernel's own; one k step's
    staging within the block's default (static) shared memory, the rest of the block's shared memory
    left for its block buffers and a second buffer. A CPU runs the C printer's GEMM: scalar, one buffer
    (its loops vectorise in the compiler), the budgets it was tuned with."""
    if device.kind == "cpu":
        return MicroBudget(128, C_STAGE_BYTES, 1, False)
    acc = 1
    while 2 * acc + 2 * round((2 * acc) ** 0.5) + BASE_REGS <= device.max_regs_per_thread:
        acc *= 2
    return MicroBudget(acc, device.default_smem_per_block_bytes, max(1, device.vector_load_bytes // 4), True)


def stage_gemms(kernel: Kernel, device: Device) -> Kernel:
    """Each tiled GEMM of `kernel` with its staging chosen for `device`: vector loads of a factor where
    `vector_width` allows them, and two staging buffers where the kernel with both still fits the
    block's shared memory and keeps its blocks per SM (or at least two: a block waiting on its next tile
    then has another to hide behind)."""
    budget = micro_budget(device)
    if not kernel.gemms:
        return kernel
    segments = []
    for seg in kernel.segments:
        phases = []
        for p in seg.phases:
            if p.gemm is not None:
                g = p.gemm
                p = dataclasses.replace(p, gemm=dataclasses.replace(
                    g, vec_a=vector_width(kernel, p, "a", budget.vector),
                    vec_b=vector_width(kernel, p, "b", budget.vector), buffers=1))
            phases.append(p)
        segments.append(dataclasses.replace(seg, phases=tuple(phases)))
    single = dataclasses.replace(kernel, segments=tuple(segments))
    if not budget.double_buffer:
        return single
    double = dataclasses.replace(single, segments=tuple(dataclasses.replace(s, phases=tuple(
        dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, buffers=2)) if p.gemm else p for p in s.phases))
        for s in single.segments))
    if double.shared_bytes > device.max_smem_per_block_bytes:
        return single
    before, _ = resident_blocks_per_sm(device, kernel.threads, 0, single.shared_bytes)
    after, _ = resident_blocks_per_sm(device, kernel.threads, 0, double.shared_bytes)
    return double if after >= min(before, 2) and after > 0 else single


def scalar_staging(kernel: Kernel) -> Kernel:
    """`kernel` with every GEMM staged element by element into one buffer: what the C target runs (its
    printer has a GEMM of its own; a GPU plan's kernels translated for it keep no GPU staging)."""
    if not kernel.gemms:
        return kernel
    return dataclasses.replace(kernel, segments=tuple(dataclasses.replace(s, phases=tuple(
        dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, vec_a=1, vec_b=1, buffers=1)) if p.gemm else p
        for p in s.phases)) for s in kernel.segments))


def vector_width(kernel: Kernel, phase: Phase, which: str, width: int) -> int:
    """`width` when every staging load of factor `which` can be one aligned vector: the factor is a
    plain fp32 load of a global tensor (no pad guard, no gather), contiguous along the axis the staging
    walks (a's k: its one reduction variable, or the innermost with an extent that `width` divides; b's
    column axis), and every other term of its offset, the start of the tile's columns (b) and the
    staging buffer's row length multiples of `width` — so each vector starts `width`-aligned (tensors are
    256 B aligned). 1 otherwise."""
    g = phase.gemm
    if width <= 1:
        return 1
    expr = strip(g.a if which == "a" else g.b, {})
    if not isinstance(expr, E.Load) or expr.pad is not None or expr.dtype != DType.F32:
        return 1
    try:
        buf = kernel.buffer(expr.tensor)
    except KeyError:
        return 1
    if buf.scope != Scope.GLOBAL or buf.dtype != DType.F32 or not all(ix.is_affine for ix in expr.index):
        return 1
    flat, stride = I.const(0), 1
    for ix, n in reversed(list(zip(expr.index, buf.shape))):
        flat, stride = flat + ix * stride, stride * n
    coeff = {a.name: k for a, k in flat.terms}
    r = phase.region.rank
    if which == "a":
        inner = g.vars[-1]
        if len(g.vars) > 1 and g.extents[-1] % width or g.bk % width:
            return 1
    else:
        inner = f"i{r - 1}"
        if (g.tx * g.tn) % width or not _starts_aligned(phase.region, r - 1, width):
            return 1
    if coeff.get(inner) != 1 or flat.const % width:
        return 1
    return width if all(k % width == 0 for v, k in coeff.items() if v != inner) else 1


def _starts_aligned(region: Region, d: int, width: int) -> bool:
    """Whether every tile's box of `region` starts axis `d` at a multiple of `width`."""
    if region.table:
        return all(row[d] % width == 0 for row in region.table)
    span = region.spans[d]
    return span.base >= 0 and span.base % width == 0 and all(c % width == 0 for c in span.coeffs) \
        and all(c >= 0 for c in span.coeffs)

