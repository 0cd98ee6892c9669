"""Hand-built Plans for the rProgram tests (a helper module, not a conftest: tests/conftest.py owns that name): kernels with blocks, threads, costs and dependencies,
without needing the scheduler."""

from __future__ import annotations

import random

from engine.schedule.plan import Candidate, Conn, EdgePlan, Group, GroupCost, Plan, Tile


def kernel(name: str, blocks: int, *, deps: tuple[str, ...] = (), threads: int = 256, shared: int = 0,
           us: float = 10.0, waves: int = 1, resident: int = 8, candidates: tuple = ()) -> dict:
    return dict(name=name, blocks=blocks, deps=deps, threads=threads, shared=shared, us=us, waves=waves,
                resident=resident, candidates=candidates)


def make_plan(kernels: list[dict], *, launch_us: float = 5.0, name: str = "toy") -> Plan:
    """One stage per kernel (named like it); a KERNEL edge for every dependency."""
    groups, edges = [], []
    for k, spec in enumerate(kernels):
        tile = Tile(spec["name"], (16, 16), spec["threads"], spec["blocks"])
        cost = GroupCost(
            footprint={"shared": spec["shared"], "register": 64}, traffic_bytes={"dram": 1 << 20},
            transactions={}, flops=1000, recompute_factor=1.0, resident_blocks_per_sm=spec["resident"],
            occupancy_limiter="threads", waves=spec["waves"], wave_efficiency=1.0,
            terms_us={"dram": spec["us"], "launch": launch_us}, modeled_us=spec["us"] + launch_us,
        )
        cands = tuple(Candidate(t, 1.0, tb, w) for t, tb, w in spec["candidates"])
        groups.append(Group(k, spec["name"], (spec["name"],), (tile,), "test", candidates=cands, cost=cost))
        edges += [EdgePlan(d, spec["name"], Conn.KERNEL, "test") for d in spec["deps"]]
    return Plan("hash", name, "test", "a100", tuple(edges), tuple(groups))


def random_plan(seed: int, n: int = 12) -> Plan:
    """A random DAG of kernels with random sizes (deps only on earlier kernels: topological)."""
    rng = random.Random(seed)
    ks = []
    for i in range(n):
        deps = tuple(sorted({f"k{j}" for j in range(i) if rng.random() < 0.25}))
        ks.append(kernel(f"k{i}", rng.randint(1, 600), deps=deps, threads=rng.choice([64, 128, 256]),
                         us=rng.uniform(1, 40), waves=rng.randint(1, 3), resident=rng.randint(1, 16),
                         shared=rng.choice([0, 4096, 16384])))
    return make_plan(ks, name=f"random{seed}")


def lstm_like_plan() -> Plan:
    """32 steps: an input projection per step (independent) feeding a tiny recurrent cell chain."""
    ks = [kernel(f"proj{t}", 8, us=3.0) for t in range(32)]
    prev: tuple[str, ...] = ()
    for t in range(32):
        ks.append(kernel(f"cell{t}", 4, deps=(f"proj{t}", *prev), us=2.0))
        prev = (f"cell{t}",)
    return make_plan(ks, name="lstm_like")


def unfused_plan(graph, device_name: str = "a100") -> Plan:
    """Every stage its own kernel with a 256-element row tile and a bandwidth-bound cost: a real
    model's kernel DAG without needing the scheduler."""
    from engine.device import get_device

    dev = get_device(device_name)
    groups = []
    for k, s in enumerate(graph.stages):
        blocks = max(1, -(-s.size // 256))
        waves = -(-blocks // (dev.sm_count * 8))
        nbytes = s.size * s.dtype.itemsize + sum(graph.specs[t].nbytes for t in s.inputs)
        us = nbytes / dev.dram_bw_bytes_per_s * 1e6 + s.flops / dev.peak_fp32_flops * 1e6
        cost = GroupCost(
            footprint={"shared": 0, "register": 32}, traffic_bytes={"dram": nbytes}, transactions={},
            flops=s.flops, recompute_factor=1.0, resident_blocks_per_sm=8, occupancy_limiter="threads",
            waves=waves, wave_efficiency=1.0, terms_us={"dram": us, "launch": 5.0}, modeled_us=us + 5.0)
        groups.append(Group(k, f"k{k:02d}_{s.op or s.kind.value}".replace(".", "_"), (s.name,),
                            (Tile(s.name, (256,), 256, blocks),), "test", cost=cost))
    edges = tuple(EdgePlan(p, c, Conn.KERNEL, "test") for p, c in graph.edges)
    return Plan(graph.structural_hash, graph.name, "unfused", device_name, edges, tuple(groups))
