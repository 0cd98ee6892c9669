"""Tile propagation: for a box of a stage's output, the box of each input it reads.

Interval analysis over the index expressions: exact (the tight bounding box of the elements read)
where the expressions are affine, conservative (a superset) through wrapping modulo, data-dependent
gathers and unions of disjoint reads; each region says which. Boxes are half-open per dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import Stage

Box = tuple[tuple[int, int], ...]  # per dimension [start, stop)


@dataclass(frozen=True)
class Region:
    box: Box | None  # None: the output box reads nothing of this tensor
    exact: bool

    @property
    def size(self) -> int:
        return box_size(self.box)


@dataclass(frozen=True)
class Propagation:
    regions: dict[str, Region]

    @property
    def exact(self) -> bool:
        return all(r.exact for r in self.regions.values())

    def box(self, tensor: str) -> Box | None:
        return self.regions[tensor].box


def box_size(box: Box | None) -> int:
    if box is None:
        return 0
    n = 1
    for lo, hi in box:
        n *= max(0, hi - lo)
    return n


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, int(d)) for d in shape)


def _union(a: Region | None, b: Region) -> Region:
    if a is None or a.box is None:
        return b if a is None or b.box is not None else Region(None, a.exact and b.exact)
    if b.box is None:
        return Region(a.box, a.exact and b.exact)
    hull = tuple((min(x[0], y[0]), max(x[1], y[1])) for x, y in zip(a.box, b.box))
    exact = a.exact and b.exact and _hull_is_union(a.box, b.box)
    return Region(hull, exact)


def _hull_is_union(a: Box, b: Box) -> bool:
    if all(x[0] <= y[0] and y[1] <= x[1] for x, y in zip(a, b)):
        return True
    if all(y[0] <= x[0] and x[1] <= y[1] for x, y in zip(a, b)):
        return True
    differ = [k for k, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(differ) == 1:
        x, y = a[differ[0]], b[differ[0]]
        return max(x[0], y[0]) <= min(x[1], y[1])  # overlapping or adjacent: no gap
    return False


def stage_ranges(stage: Stage, out_box: Box, reduce_box: Box | None = None) -> dict[str, I.Interval]:
    """Inclusive variable ranges for an output box (and a reduce box, default: whole reduction)."""
    if len(out_box) != len(stage.shape):
        raise ValueError(f"box of rank {len(out_box)} for stage {stage.name} of rank {len(stage.shape)}")
    ranges = {f"i{k}": (lo, hi - 1) for k, (lo, hi) in enumerate(out_box)}
    rbox = reduce_box or full_box(stage.reduce)
    ranges.update({f"r{k}": (lo, hi - 1) for k, (lo, hi) in enumerate(rbox)})
    return ranges


def propagate(
    stage: Stage,
    out_box: Box,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    reduce_box: Box | None = None,
) -> Propagation:
    """Box of every input of `stage` read to compute `out_box` of its output.

    `input_shapes` clips reads to each tensor (needed for padded loads: conv halos, concat).
    """
    if box_size(out_box) == 0:
        return Propagation({t: Region(None, True) for t in stage.inputs})
    ranges = stage_ranges(stage, out_box, reduce_box)
    regions: dict[str, Region] = {}
    for node in E.walk(stage.body):
        if isinstance(node, E.Load):
            _add_load(regions, node.tensor, node.index, node.pad is not None, ranges, input_shapes)
        elif isinstance(node, E.IndexVal):
            for a, _ in node.expr.terms:
                _add_indirect(regions, a, ranges, input_shapes)
    for t in stage.inputs:
        regions.setdefault(t, Region(None, True))
    return Propagation(regions)


def _add_load(regions, tensor, index, guarded, ranges, shapes) -> None:
    box, exact = [], True
    shape = shapes.get(tensor) if shapes else None
    for d, e in enumerate(index):
        (lo, hi), ex = I.bounds(e, ranges)
        exact = exact and ex
        if shape is not None and (guarded or lo < 0 or hi >= shape[d]):
            clipped = (max(lo, 0), min(hi, shape[d] - 1))
            if clipped != (lo, hi) and not I.is_dense(e, ranges):
                exact = False  # a strided read clipped to the tensor need not touch the new ends
            lo, hi = clipped
        box.append((lo, hi + 1))
        for a, _ in e.terms:
            _add_indirect(regions, a, ranges, shapes)
    if any(hi <= lo for lo, hi in box):
        region = Region(None, exact)
    else:
        region = Region(tuple(box), exact)
    regions[tensor] = _union(regions.get(tensor), region)


def _add_indirect(regions, atom, ranges, shapes) -> None:
    if isinstance(atom, I.Indirect):
        _add_load(regions, atom.tensor, atom.index, False, ranges, shapes)
    elif isinstance(atom, (I.FloorDiv, I.Mod, I.Abs)):
        for a, _ in atom.x.terms:
            _add_indirect(regions, a, ranges, shapes)
    elif isinstance(atom, (I.Min, I.Max)):
        for a, _ in atom.a.terms + atom.b.terms:
            _add_indirect(regions, a, ranges, shapes)


# ---- every tile at once ---------------------------------------------------------------------------
# The same interval analysis over arrays: row t of `lo`/`hi` is tile t's box. Building a kernel
# propagates every tile of its grid through every stage of a segment (tens of thousands of boxes for a
# schedule's candidate); one NumPy pass per stage replaces a Python pass per tile. Tightness flags are
# not kept: the callers want boxes only.

Boxes = tuple[np.ndarray, np.ndarray]  # (lo, hi) int64 [tiles, rank], half-open; a row with hi <= lo: no box


def _as_rows(x, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.int64), (n,))


def bounds_many(e: I.Lin, ranges: Mapping[str, tuple]) -> tuple:
    """`index.bounds` for every tile at once: `ranges` maps a variable to inclusive (lo, hi) arrays (or
    ints, the same for every tile)."""
    lo = hi = e.const
    for atom, k in e.terms:
        alo, ahi = _atom_bounds_many(atom, ranges)
        if k >= 0:
            lo, hi = lo + k * alo, hi + k * ahi
        else:
            lo, hi = lo + k * ahi, hi + k * alo
    return lo, hi


def _atom_bounds_many(atom, ranges: Mapping[str, tuple]) -> tuple:
    if isinstance(atom, I.Var):
        return ranges[atom.name]
    if isinstance(atom, I.FloorDiv):
        lo, hi = bounds_many(atom.x, ranges)
        return np.floor_divide(lo, atom.k), np.floor_divide(hi, atom.k)
    if isinstance(atom, I.Mod):
        lo, hi = bounds_many(atom.x, ranges)
        whole = np.floor_divide(lo, atom.k) == np.floor_divide(hi, atom.k)
        return np.where(whole, np.mod(lo, atom.k), 0), np.where(whole, np.mod(hi, atom.k), atom.k - 1)
    if isinstance(atom, (I.Min, I.Max)):
        (alo, ahi), (blo, bhi) = bounds_many(atom.a, ranges), bounds_many(atom.b, ranges)
        f = np.minimum if isinstance(atom, I.Min) else np.maximum
        return f(alo, blo), f(ahi, bhi)
    if isinstance(atom, I.Abs):
        lo, hi = bounds_many(atom.x, ranges)
        return (np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0)),
                np.where(lo >= 0, hi, np.where(hi <= 0, -lo, np.maximum(-lo, hi))))
    if isinstance(atom, I.Indirect):
        return 0, atom.size - 1
    raise TypeError(atom)


def propagate_many(stage: Stage, out: Boxes, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Boxes]:
    """`propagate` over many output boxes: (lo, hi) per input of `stage`, rows with no box (an empty
    output box, or nothing of the input read) having hi <= lo. Row for row the boxes `propagate` gives."""
    olo, ohi = out
    n = olo.shape[0]
    live = np.all(ohi > olo, axis=1)
    ranges = {f"i{k}": (olo[:, k], ohi[:, k] - 1) for k in range(olo.shape[1])}
    ranges.update({f"r{k}": (0, r - 1) for k, r in enumerate(stage.reduce)})
    acc: dict[str, Boxes] = {}

    def add_load(tensor: str, index) -> None:
        shape = input_shapes.get(tensor)
        lo = np.empty((n, len(index)), dtype=np.int64)
        hi = np.empty_like(lo)
        for d, e in enumerate(index):
            a, b = bounds_many(e, ranges)
            if shape is not None:  # clipping an in-range read changes nothing
                a, b = np.maximum(a, 0), np.minimum(b, shape[d] - 1)
            lo[:, d], hi[:, d] = _as_rows(a, n), _as_rows(b, n) + 1
            for atom, _ in e.terms:
                add_indirect(atom)
        ok = live & np.all(hi > lo, axis=1)
        if tensor in acc:
            plo, phi = acc[tensor]
            was = np.all(phi > plo, axis=1)
            both = (ok & was)[:, None]
            lo = np.where(both, np.minimum(lo, plo), np.where(ok[:, None], lo, plo))
            hi = np.where(both, np.maximum(hi, phi), np.where(ok[:, None], hi, phi))
            ok = ok | was
        acc[tensor] = (np.where(ok[:, None], lo, 0), np.where(ok[:, None], hi, 0))

    def add_indirect(atom) -> None:
        if isinstance(atom, I.Indirect):
            add_load(atom.tensor, atom.index)
        elif isinstance(atom, (I.FloorDiv, I.Mod, I.Abs)):
            for a, _ in atom.x.terms:
                add_indirect(a)
        elif isinstance(atom, (I.Min, I.Max)):
            for a, _ in atom.a.terms + atom.b.terms:
                add_indirect(a)

    for node in E.walk(stage.body):
        if isinstance(node, E.Load):
            add_load(node.tensor, node.index)
        elif isinstance(node, E.IndexVal):
            for a, _ in node.expr.terms:
                add_indirect(a)
    add_load = add_indirect = None  # noqa: F841 -- they refer to each other: no cycle left for the garbage collector
    for t in stage.inputs:
        if t not in acc:
            rank = len(input_shapes[t]) if t in input_shapes else 1
            acc[t] = (np.zeros((n, rank), np.int64), np.zeros((n, rank), np.int64))
    return acc
