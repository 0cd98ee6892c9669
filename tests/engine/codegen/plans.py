"""Hand-built plans for codegen tests (until every test uses the scheduler's make_plan): every edge
KERNEL, or chosen edges fused at a level, with a simple row tile per segment."""

from __future__ import annotations

from engine.ir.graph import PrimGraph
from engine.schedule.plan import Conn, Group, Plan, PlanBuilder, Tile, components, kernel_name


def default_tile(shape: tuple[int, ...], target: int = 256, threads: int = 128) -> Tile:
    """Fill the tile from the innermost axis outward up to `target` elements."""
    tile, left = [], target
    for n in reversed(shape):
        t = max(1, min(n, left))
        tile.append(t)
        left = max(1, left // t)
    tile = tuple(reversed(tile))
    blocks = 1
    for n, t in zip(shape, tile):
        blocks *= -(-n // t)
    return Tile("", tile, threads, blocks)


def make_test_plan(graph: PrimGraph, conns: dict | None = None, tiles: dict | None = None,
                   policy: str = "test") -> Plan:
    """Edges in `conns` get their level (others KERNEL); each segment's anchor gets `tiles[stage]` or a
    default tile."""
    b = PlanBuilder(graph)
    for (p, c), conn in (conns or {}).items():
        b.set(p, c, conn, "test")
    edges = b.edges()
    cmap = {e.key: e.conn for e in edges}
    groups = []
    for k, names in enumerate(components(graph, cmap)):
        inner = {(p, c): v for (p, c), v in cmap.items() if p in names and c in names}
        # Segment anchors: stages with no REGISTER/SHARED consumer inside the group.
        anchors = [s for s in names if not any(p == s and v in (Conn.REGISTER, Conn.SHARED)
                                               for (p, _), v in inner.items())]
        segs = []
        for a in anchors:
            t = (tiles or {}).get(a) or default_tile(graph.stage(a).shape)
            segs.append(Tile(a, t.shape, t.threads, t.blocks))
        groups.append(Group(k, kernel_name(k, graph, names), tuple(names), tuple(segs), "test"))
    return Plan(graph.structural_hash, graph.name, policy, "a100", edges, tuple(groups))


def fuse_all(graph: PrimGraph, conn: Conn = Conn.REGISTER, reduce_conn: Conn = Conn.SHARED) -> dict:
    """Every edge at `conn`, edges out of reductions at `reduce_conn`."""
    out = {}
    for p, c in graph.edges:
        out[(p, c)] = reduce_conn if graph.stage(p).reduce else conn
    return out
