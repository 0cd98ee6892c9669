"""Group-level tile structure: segments of a kernel group (split at grid barriers), their sinks, and
tile propagation backwards from a segment's anchor through every in-segment edge.

In: a PrimGraph, a group's stages and the edge connections. Out: plain boxes per stage and input."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.ir.graph import PrimGraph
from engine.tilegraph.propagate import Box, Region, _union, box_size, full_box, propagate

# Connections that keep producer and consumer in one segment (strings, so this module does not
# depend on engine.schedule; Conn is a StrEnum and compares equal to these).
IN_SEGMENT = ("register", "shared")


def inner_edges(graph: PrimGraph, segment: Sequence[str], conns: Mapping) -> tuple:
    """(producer, consumer, connection) of every edge with both ends in `segment`: all of the
    connections a segment's kernel IR, regions, floor recipe and count read (an edge leaving it is
    read only as "a consumer outside", fixed by the graph) — the part of `conns` that memo keys on one
    segment hold. A merge elsewhere that changes an edge leaving the segment (KERNEL to GLOBAL_SYNC)
    then finds the segment's builds again."""
    members = set(segment)
    return tuple((p, c, str(conns.get((p, c)))) for p in segment for c in graph.consumers.get(p, ()) if c in members)


def stage_order(graph: PrimGraph) -> dict[str, int]:
    """Stage name -> topological position (memoised per graph object)."""
    return _per_graph("tilegraph.order", graph, lambda: {s.name: k for k, s in enumerate(graph.stages)})


def tensor_shapes(graph: PrimGraph) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape for every input, constant and stage (memoised per graph object)."""
    return _per_graph("tilegraph.shapes", graph, lambda: {n: t.shape for n, t in graph.specs.items()})


def _per_graph(name: str, graph: PrimGraph, compute):
    """A value derived from one graph object, memoised on its identity (the graph is kept beside the
    entry, so its id cannot be reused by another graph while the entry lives)."""
    from engine.memo import memo

    table = memo(name, 64)
    hit = table.get(id(graph))
    if hit is None or hit[0] is not graph:
        hit = table.put(id(graph), (graph, compute()))
    return hit[1]


@dataclass(frozen=True)
class GroupRegions:
    """What one block of a segment touches: a box per in-segment stage (its computed region) and per
    tensor read from outside the segment (group inputs, weights, earlier segments)."""

    anchor: str
    stages: dict[str, Box]
    inputs: dict[str, Box]
    exact: bool


class DisjointSets:
    """Union-find over stage names (path halving): kernel groups, segments, tuning blocks."""

    def __init__(self, names: Sequence[str]) -> None:
        self.parent = {n: n for n in names}

    def find(self, x: str) -> str:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)

    def groups(self, graph: PrimGraph, names: Sequence[str]) -> list[list[str]]:
        """The sets over `names`, each in stage order, ordered by their first stage."""
        order = stage_order(graph)
        out: dict[str, list[str]] = {}
        for s in sorted(names, key=order.__getitem__):
            out.setdefault(self.find(s), []).append(s)
        return sorted(out.values(), key=lambda seg: order[seg[0]])


def segments_of(graph: PrimGraph, stages: Sequence[str], conns: Mapping[tuple[str, str], str]) -> list[list[str]]:
    """Segments of one group: components of its REGISTER/SHARED edges, each in stage order, ordered
    by first stage (a GLOBAL_SYNC producer's segment always precedes its consumer's)."""
    members = set(stages)
    sets = DisjointSets(stages)
    for p in stages:
        for c in graph.consumers.get(p, ()):
            if c in members and conns.get((p, c)) in IN_SEGMENT:
                sets.union(p, c)
    return sets.groups(graph, stages)


def segment_sinks(graph: PrimGraph, segment: Sequence[str], conns: Mapping[tuple[str, str], str]) -> list[str]:
    """Stages of the segment with no consumer inside it (a valid segment has exactly one)."""
    members = set(segment)
    fed = {p for p in segment for c in graph.consumers.get(p, ()) if c in members and conns.get((p, c)) in IN_SEGMENT}
    return [s for s in segment if s not in fed]


def anchor_box(shape: Sequence[int], tile: Sequence[int], index: Sequence[int] | None = None) -> Box:
    """Box of block `index` (default: the first block) of a tile grid over `shape`, clipped."""
    index = index or [0] * len(shape)
    return tuple((k * t, min(d, (k + 1) * t)) for d, t, k in zip(shape, tile, index))


def typical_index(shape: Sequence[int], tile: Sequence[int]) -> tuple[int, ...]:
    """The block that stands for all when one is sampled: an interior one along every axis of three or
    more tiles (its halos unclipped by padding, its tile full: the largest footprint and work of the grid,
    where the first block at a padded corner would understate both), else the first."""
    counts = [-(-d // t) for d, t in zip(shape, tile)]
    return tuple(n // 2 if n >= 3 else 0 for n in counts)


PROPAGATIONS_KEPT = 50_000  # (stage, box) propagations kept per graph (`propagate_group`; zoo swin plans with 5,695)


def propagate_group(
    graph: PrimGraph,
    segment: Sequence[str],
    conns: Mapping[tuple[str, str], str],
    anchor: str,
    out_box: Box,
) -> GroupRegions:
    """Regions one block computes and reads when it produces `out_box` of the anchor.

    Walks the segment in reverse stage order; a stage's region is the union (hull) of the regions
    all its in-segment consumers need. Reductions are propagated over their whole reduce range,
    since a block must finish the reduction of every output element it owns."""
    members = set(segment)
    order = stage_order(graph)
    shapes = tensor_shapes(graph)
    # What a stage reads for a box depends on the stage and the box alone: the tile search propagates the
    # same boxes through the same stages for many candidates and groups (bert12 on host: 9,646 propagations
    # of 2,235 distinct stage and box pairs; zoo swin 37,072 of 5,695).
    done = _per_graph("tilegraph.propagations", graph, dict)
    if len(done) > PROPAGATIONS_KEPT:
        done.clear()
    need: dict[str, Region] = {anchor: Region(out_box, True)}
    inputs: dict[str, Region] = {}
    exact = True
    for name in sorted(members, key=order.__getitem__, reverse=True):
        region = need.get(name)
        if region is None or region.box is None:
            continue
        exact = exact and region.exact
        prop = done.get((name, region.box))
        if prop is None:
            prop = done[(name, region.box)] = propagate(graph.stage(name), region.box, shapes)
        for tensor, r in prop.regions.items():
            inside = tensor in members and conns.get((tensor, name)) in IN_SEGMENT
            target = need if inside else inputs
            target[tensor] = _union(target.get(tensor), Region(r.box, r.exact and region.exact))
    stage_boxes = {n: r.box for n, r in need.items() if n in members and r.box is not None}
    input_boxes = {n: r.box for n, r in inputs.items() if r.box is not None}
    exact = exact and all(r.exact for r in inputs.values())
    return GroupRegions(anchor, stage_boxes, input_boxes, exact)


def tile_counts(shape: Sequence[int], tile: Sequence[int]) -> int:
    """Number of blocks of a tile grid: prod(ceil(dim / tile))."""
    n = 1
    for d, t in zip(shape, tile):
        n *= -(-int(d) // max(1, int(t)))
    return n


__all__ = ["GroupRegions", "segments_of", "segment_sinks", "anchor_box", "typical_index", "propagate_group", "tile_counts",
           "box_size", "full_box"]
