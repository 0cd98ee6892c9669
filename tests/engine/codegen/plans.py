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
                   policy: str = "test", options: dict | None = None) -> Plan:
    """Edges in `conns` get their level (others KERNEL); each segment's anchor gets `tiles[stage]` or a
    default tile; `options` become the plan's (e.g. a recompute_bound)."""
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
    return Plan(graph.structural_hash, graph.name, policy, "a100", edges, tuple(groups),
                options=tuple(sorted((options or {}).items())))


def fuse_all(graph: PrimGraph, conn: Conn = Conn.REGISTER, reduce_conn: Conn = Conn.SHARED) -> dict:
    """Every edge at `conn`, edges out of reductions at `reduce_conn`."""
    out = {}
    for p, c in graph.edges:
        out[(p, c)] = reduce_conn if graph.stage(p).reduce else conn
    return out


def acyclic(graph: PrimGraph, wanted: dict) -> dict:
    """Add the wanted connections one at a time, dropping any that would make kernel groups depend on
    each other in a cycle (a group both before and after another)."""
    from engine.schedule.validate import find_group_cycle

    out: dict = {}
    by_producer: dict = {}
    for (p, c), conn in wanted.items():
        by_producer.setdefault(p, {})[(p, c)] = conn
    for p, edges in by_producer.items():
        if len(edges) != len(graph.consumers.get(p, ())):
            continue  # all of a producer's edges or none: no stage is both in a block and needed whole
        trial = dict(out)
        trial.update(edges)
        full = {e: trial.get(e, Conn.KERNEL) for e in graph.edges}
        comps = components(graph, full)
        fed = {p for (p, _), v in trial.items() if v in (Conn.REGISTER, Conn.SHARED)}
        one_sink = all(sum(s not in fed for s in comp) == 1 for comp in comps)
        if one_sink and not find_group_cycle(graph, comps):
            out = trial
    return out


def fuse_memory(graph: PrimGraph, reductions: bool = True) -> dict:
    """Memory-intensive stages fused (contractions stay separate kernels), without group cycles: the
    elementwise / stitch style hand plan that works on whole models."""
    out = {}
    for p, c in graph.edges:
        if graph.stage(p).kind.value == "contraction" or graph.stage(c).kind.value == "contraction":
            continue
        if not reductions and (graph.stage(p).reduce or graph.stage(c).reduce):
            continue
        out[(p, c)] = Conn.SHARED if graph.stage(p).reduce else Conn.REGISTER
    return acyclic(graph, out)


HAND_FUSED = {
    # Two segments split by a grid barrier (cooperative kernel), REGISTER chains on both sides; tiles
    # large enough that every block is resident in one wave (validate's global_sync_wave rule).
    "gelu_chain_global_sync": ("gelu_chain", {"Mul_7_out->Tanh_8_out": Conn.GLOBAL_SYNC},
                               {"Mul_7_out": Tile("", (8, 512), 256, 96), "y": Tile("", (8, 512), 256, 96)}),
    "masked_softmax_global_sync": ("masked_softmax", {"Add_6_out->probs::max": Conn.GLOBAL_SYNC,
                                                      "Add_6_out->probs::exp": Conn.GLOBAL_SYNC},
                                   {"Add_6_out": Tile("", (1, 1, 16, 128), 256, 96),
                                    "probs": Tile("", (1, 1, 16, 128), 256, 96)}),
}


def hand_conns(graph: PrimGraph, overrides: dict[str, Conn]) -> dict:
    """fuse_all with some edges (written "producer->consumer") set explicitly."""
    conns = fuse_all(graph)
    for key, conn in overrides.items():
        p, c = key.split("->")
        assert (p, c) in conns, key
        conns[(p, c)] = conn
    return conns


def policy_plan(graph: PrimGraph, policy: str, device: str = "a100") -> Plan:
    """The scheduler's plan when engine.schedule.make_plan exists; else a hand-built stand-in."""
    try:
        from engine.schedule.policies import make_plan
    except ImportError:
        make_plan = None
    if make_plan is not None:
        from engine.device import get_device

        return make_plan(graph, policy, get_device(device))
    conns = {"unfused": None, "elementwise": None, "stitch": fuse_memory(graph), "welder": fuse_memory(graph)}
    if policy == "elementwise":
        conns["elementwise"] = fuse_memory(graph, reductions=False)
    return make_test_plan(graph, conns[policy], policy=policy)
