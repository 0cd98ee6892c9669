"""Fusion policies, each PrimGraph × Device → Plan: unfused, elementwise, stitch, welder, and user
(an edit list replayed on one of them). `make_plan` is the entry point."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from engine.device import Device
from engine.errors import PlanError
from engine.flags import debug
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Edit, Plan

POLICIES = ("unfused", "elementwise", "stitch", "welder")


_GC = {"planning": 0, "resume": False}
_GC_LOCK = threading.Lock()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a plan is made, and restored (as it was) when the
    last plan under way in the process ends. Planning grows the memo tables by hundreds of thousands of
    objects, and each collection of the older generations walks all of them: 12-17 % of a cold welder plan
    (bert12 0.3 of 1.95 s, zoo swin 1.9 of 11.5 s; benchmarks/NOTES.md gcpause). What planning frees is freed
    by reference counting as before. At the end the objects it made join the oldest generation without a
    walk (`gc.freeze` then `gc.unfreeze`): they are mostly the memo tables' entries, which live on, and the
    next collection of young objects would otherwise walk every one of them (0.6 s after swin's plan); any
    cycle among them is freed by the next full collection. Counted across threads: the workbench plans for
    several sessions at once."""
    with _GC_LOCK:
        if _GC["planning"] == 0:
            _GC["resume"] = gc.isenabled()
            gc.disable()
        _GC["planning"] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC["planning"] -= 1
            if _GC["planning"] == 0 and _GC["resume"]:
                gc.freeze()
                gc.unfreeze()
                gc.enable()


def make_plan(graph: PrimGraph, policy: str, device: Device | str, *, edits: Sequence[Edit] = (),
              options: Mapping | None = None) -> Plan:
    """Schedule `graph` with `policy` on `device` (a Device, preset name or device file); with
    `edits`, replay them on top and validate (policy "user")."""
    from engine.schedule.policies import elementwise, stitch, unfused, welder

    if isinstance(device, str):
        from engine.device import get_device

        device = get_device(device)

    fns = {"unfused": unfused.plan_unfused, "elementwise": elementwise.plan_elementwise,
           "stitch": stitch.plan_stitch, "welder": welder.plan_welder}
    if policy == "user":
        base = (options or {}).get("base_policy", "welder")
        from engine.schedule.edits import replay

        return replay(base, edits, graph, device, options=options)
    if policy not in fns:
        raise PlanError(f"unknown policy '{policy}'", hint=f"use one of {', '.join(POLICIES)}, user")
    from engine.schedule.validate import bounded

    started = time.perf_counter()
    with bounded(options), gc_paused():
        plan = fns[policy](graph, device, options or {}, started)
    debug(1, f"{policy} on {device.name}: {plan.kernels} kernels, DRAM {plan.dram_bytes} B, "
             f"modeled {plan.modeled_us:.1f} us, scheduled in {plan.schedule_seconds:.2f} s")
    for g in plan.groups:
        debug(2, f"{g.name}: {len(g.stages)} stages, {g.blocks} blocks x {g.threads} threads, "
                 f"{g.cost.modeled_us if g.cost else 0:.2f} us ({g.reason})")
    if edits:
        from engine.schedule.edits import replay

        return replay(policy, edits, graph, device, options=options)
    return plan
