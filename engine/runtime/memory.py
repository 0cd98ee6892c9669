"""Static memory planning: intermediate tensors and their live launch ranges in, arena offsets out.

Greedy best-fit by size over the launch order (Wolong-style static planning): two tensors share bytes
only when their live ranges [first, last] are disjoint. The peak is reported beside the naive sum.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.codegen.kir import Allocation, MemoryPlan

ALIGN = 256  # CUDA allocations are 256 B aligned; vector loads want it on the CPU too


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_memory(tensors: Sequence[tuple[str, int, int, int]]) -> MemoryPlan:
    """Place (tensor, nbytes, first launch, last launch) tuples in one arena; largest first, each at
    the lowest offset that does not overlap a live-range-overlapping tensor already placed."""
    placed: list[Allocation] = []
    for name, nbytes, first, last in sorted(tensors, key=lambda t: (-t[1], t[2], t[0])):
        size = _align(max(nbytes, 1))
        clashes = sorted((a.offset, a.offset + _align(a.nbytes)) for a in placed
                         if not (a.last < first or last < a.first))
        offset = 0
        for lo, hi in clashes:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append(Allocation(name, offset, nbytes, first, last))
    arena = max((a.offset + _align(a.nbytes) for a in placed), default=0)
    naive = sum(_align(t[1]) for t in tensors)
    order = {t[0]: k for k, t in enumerate(tensors)}
    return MemoryPlan(tuple(sorted(placed, key=lambda a: order[a.tensor])), arena, naive)
