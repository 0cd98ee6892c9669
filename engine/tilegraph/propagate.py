"""Tile propagation: for a box of a stage's output, the box of each input it reads.

Interval analysis over the index expressions: exact (the tight bounding box of the elements read)
where the expressions are affine, conservative (a superset) through wrapping modulo, data-dependent
gathers and unions of disjoint reads; each region says which. Boxes are half-open per dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
