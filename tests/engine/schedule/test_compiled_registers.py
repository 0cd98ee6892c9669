"""Issue 13 item 4: the cost model at the registers NVRTC compiled a kernel to (read from its CUBIN, no
GPU), in place of the formula, wherever a compiled kernel exists: `cost.at_compiled_registers`,
`codegen.api.at_compiled`, and the paths that compile (measure, `tileweave compile`, bundles)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support import sample_path

from engine.api import load_graph
from engine.codegen.api import compile_program, compiled_registers
from engine.codegen.generate import generate
from engine.device import get_device
from engine.schedule.cost import at_compiled_registers
from engine.schedule.measure import compile_variant
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import plan_from_json, plan_to_json


@pytest.fixture(scope="module")
def planned():
    device = get_device("a100")
    graph, plan = plan_model(load_graph(sample_path("layernorm_residual")), "stitch", device)
    return device, graph, plan


def test_formula_is_the_default_source(planned):
    _, _, plan = planned
    assert all(g.cost.registers_from == "formula" for g in plan.groups)


def test_more_registers_never_raise_occupancy_or_lower_the_time(planned):
    device, graph, plan = planned
    formula = {g.name: g.cost.footprint["register"] for g in plan.groups}
    same = at_compiled_registers(plan, graph, device, formula, "test")
    for a, b in zip(plan.groups, same.groups):  # the formula's own counts: the same figures
        assert b.cost.modeled_us == a.cost.modeled_us and b.cost.registers_from == "test"
    heavy = at_compiled_registers(plan, graph, device, {g.name: device.max_regs_per_thread for g in plan.groups}, "t")
    for a, b in zip(plan.groups, heavy.groups):
        assert b.cost.footprint["register"] == device.max_regs_per_thread
        assert b.cost.resident_blocks_per_sm <= a.cost.resident_blocks_per_sm
        assert b.cost.modeled_us >= a.cost.modeled_us
    # At the most registers a thread may have, 1024-thread blocks fit no more than one per SM: some
    # group's occupancy must fall for the figures to have followed the count.
    assert any(b.cost.resident_blocks_per_sm < a.cost.resident_blocks_per_sm
               for a, b in zip(plan.groups, heavy.groups))
    # ... and its grids (512-768 blocks) are over one wave at one block per SM: the time follows too.
    assert any(b.cost.modeled_us > a.cost.modeled_us for a, b in zip(plan.groups, heavy.groups))


def test_a_kernel_without_a_count_and_the_host_keep_their_cost(planned):
    device, graph, plan = planned
    first = plan.groups[0]
    partial = at_compiled_registers(plan, graph, device, {first.name: 200}, "t")
    assert partial.groups[0].cost.registers_from == "t"
    assert all(g.cost == h.cost for g, h in zip(plan.groups[1:], partial.groups[1:]))
    host = dataclasses.replace(device, kind="cpu")
    assert at_compiled_registers(plan, graph, host, {first.name: 200}, "t") is plan


def test_compiled_variant_carries_the_cubin_counts_and_round_trips(planned):
    device, graph, plan = planned
    compiled = compile_variant(graph, plan, device)
    regs = compiled_registers(compile_program(generate(plan, graph, device), "cuda", archs=("sm_80",)), "sm_80")
    assert set(regs) == {g.name for g in plan.groups} and all(r > 0 for r in regs.values())
    for g in compiled.plan.groups:
        assert g.cost.footprint["register"] == regs[g.name], g.name
        assert g.cost.registers_from == "sm_80 CUBIN"
        assert g.score == g.cost.modeled_us
    back = plan_from_json(plan_to_json(compiled.plan), graph)
    assert [g.cost for g in back.groups] == [g.cost for g in compiled.plan.groups]
    assert compiled_registers(compile_program(generate(plan, graph, device), "cuda", archs=("sm_80",)), "sm_90") == {}


def test_a_host_variant_is_the_library_a_run_builds(tmp_path, monkeypatch):
    """The tune and the cost-model benchmark measure the library `tileweave run` loads: compile_variant links
    it from per-kernel units as runtime.cpu.compile_program_c does, under the same cache key, and never builds
    the program whole (one translation unit: other machine code for the same kernels, which a later run then
    found in the cache)."""
    from engine.codegen import ccompile
    from engine.host import host_device
    from engine.runtime.cpu import compile_program_c

    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    device = host_device()
    graph, plan = plan_model(load_graph(sample_path("layernorm_residual")), "unfused", device)
    whole = []
    real = ccompile.compile_c
    monkeypatch.setattr(ccompile, "compile_c", lambda source, **kw: whole.append(kw.get("name")) or real(source, **kw))
    compiled = compile_variant(graph, plan, device)
    assert len(plan.groups) > 1 and whole == []
    module = compile_program_c(compiled.program)  # a cache hit (compile_c returns the cached library)
    assert Path(module.path).name == compiled.library_name
    assert Path(module.path).read_bytes() == compiled.library
