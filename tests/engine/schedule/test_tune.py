"""engine/schedule/tune.py: measured tuning. The choice is tested with injected timings (a `measure`
function over our own plans) so every outcome is forced; the real measurement runs once on the host.
Properties: the blocks every policy's groups tile are acyclic, the tuned plan validates, and its
measured kernels sum to no more than any policy's."""

from __future__ import annotations

import pytest
from support import max_rel_error, sample_path

from engine.api import load_graph
from engine.cli import main
from engine.device import get_device
from engine.errors import BackendError, PlanError
from engine.schedule.pipeline import plan_model
from engine.schedule.policies import make_plan
from engine.schedule.tune import blocks_of, tune_plan
from engine.schedule.validate import find_group_cycle, validate

SAMPLES = ("bert_layer", "conv_bn_relu", "layernorm_residual", "mobilenetv2_block", "masked_softmax")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Measurements are kept in the tuning database under the cache folder: each test starts with none."""
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))


def policy_plans(name: str, device="a100"):
    graph, welder = plan_model(load_graph(sample_path(name)), "welder", device)
    plans = {"welder": welder}
    for policy in ("unfused", "elementwise", "stitch"):
        plans[policy] = make_plan(graph, policy, device, options={"batching": True})
    return graph, plans


@pytest.mark.parametrize("name", SAMPLES)
def test_blocks_partition_the_stages_and_are_unions_of_every_plans_groups(name):
    graph, plans = policy_plans(name)
    blocks = blocks_of(graph, list(plans.values()))
    assert sorted(s for b in blocks for s in b) == sorted(s.name for s in graph.stages)
    of = {s: k for k, b in enumerate(blocks) for s in b}
    for plan in plans.values():
        for g in plan.groups:
            assert len({of[s] for s in g.stages}) == 1, g.name
    assert find_group_cycle(graph, blocks) == []
    # Listed in a topological order: no block reads from a later one.
    assert all(of[p] <= of[c] for p, c in graph.edges)


def timed(fused: float = 1.0, per_stage: float = 0.0, calls: list | None = None):
    """A measure function: a kernel's modeled time, times `fused` when it fuses stages, times 1 +
    `per_stage` per stage. A function of the kernel alone (as a real kernel's time is), so identical
    kernels of different plans measure alike."""
    def measure(plan):
        if calls is not None:
            calls.append(plan.policy)
        return {g.name: g.cost.modeled_us * (fused if len(g.stages) > 1 else 1.0) * (1 + per_stage * len(g.stages))
                for g in plan.groups}
    return measure


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("timing", [{}, {"fused": 9.0}, {"per_stage": 0.5}])
def test_tuned_welder_is_never_slower_than_any_policy(name, timing):
    device = get_device("a100")
    graph, plans = policy_plans(name)
    measure = timed(**timing)
    totals = {p: sum(measure(pl).values()) for p, pl in plans.items()}
    alternatives = {p: pl for p, pl in plans.items() if p != "welder"}
    tuned = tune_plan(graph, plans["welder"], device, 1, measure=measure, alternatives=alternatives)
    assert not validate(tuned, graph, device)
    assert tuned.policy == "welder" and dict(tuned.options)["tune"] == 1
    assert all(g.measured_us is not None for g in tuned.groups)
    assert tuned.measured_us <= min(totals.values()) + 5e-4 * len(tuned.groups)  # measured_us kept to 3 decimals
    assert any(d.startswith("tune: 1 tile candidate") for d in tuned.decisions)
    if timing.get("fused"):  # every fused kernel 9x slower: each stage runs alone
        assert all(len(g.stages) == 1 for g in tuned.groups)


def fixed_programs(fastest: str, calls: list):
    """A program measure (plans by name -> whole-program µs): `fastest` 50 µs, every other 100."""
    def measure(plans):
        calls.append(sorted(plans))
        return {name: 50.0 if name == fastest else 100.0 for name in plans}
    return measure


@pytest.mark.parametrize("fastest", ["tuned", "welder untuned", "stitch untuned", "unfused untuned"])
def test_the_fastest_whole_program_is_kept(fastest):
    """Kernels timed one at a time do not add up to the program: after choosing by kernel times, the tuned
    plan, the untuned welder plan and the alternatives are timed whole and the fastest is kept — as a
    welder plan with the tune's options, its kernels' measured times, and a decision naming every time."""
    device = get_device("a100")
    graph, plans = policy_plans("bert_layer")
    alternatives = {p: pl for p, pl in plans.items() if p != "welder"}
    measure = timed(fused=9.0)  # by kernels, every stage alone wins: unlike the welder plan
    by_kernels = tune_plan(graph, plans["welder"], device, 2, measure=measure, alternatives=alternatives)
    assert all(len(g.stages) == 1 for g in by_kernels.groups)
    calls: list = []
    tuned = tune_plan(graph, plans["welder"], device, 2, measure=measure, alternatives=alternatives,
                      program_measure=fixed_programs(fastest, calls))
    assert calls == [sorted(["tuned", "welder untuned", "unfused untuned", "elementwise untuned", "stitch untuned"])]
    assert tuned.policy == "welder" and dict(tuned.options)["tune"] == 2 and not validate(tuned, graph, device)
    assert tuned.decisions[-1].startswith("tune: whole programs measured") and tuned.decisions[-1].endswith(
        f"kept the {fastest} plan")
    assert any(d.startswith("tune: 2 tile candidate") for d in tuned.decisions)
    assert all(g.measured_us is not None for g in tuned.groups)
    kept = by_kernels if fastest == "tuned" else plans[fastest.split()[0]]
    assert [(g.stages, g.segments) for g in tuned.groups] == [(g.stages, g.segments) for g in kept.groups]


def test_the_untuned_plan_stays_unless_another_program_is_clearly_faster():
    """Within PROGRAM_MARGIN of the untuned welder plan's whole-program time, a faster-measuring program
    does not replace it (the rounds' noise); past it, it does."""
    from engine.schedule.tune import PROGRAM_MARGIN

    device = get_device("a100")
    graph, plans = policy_plans("bert_layer")
    alternatives = {p: pl for p, pl in plans.items() if p != "welder"}
    for stitch_us, kept in ((100.0 / (1 + PROGRAM_MARGIN / 2), "welder untuned"),
                            (100.0 / (1 + 2 * PROGRAM_MARGIN), "stitch untuned")):
        def programs(plans_, stitch_us=stitch_us):
            return {n: {"welder untuned": 100.0, "stitch untuned": stitch_us}.get(n, 200.0) for n in plans_}
        tuned = tune_plan(graph, plans["welder"], device, 1, measure=timed(), alternatives=alternatives,
                          program_measure=programs)
        assert tuned.decisions[-1].endswith(f"kept the {kept} plan")


def test_tile_candidates_are_measured_and_the_fastest_kept():
    device = get_device("a100")
    graph, plans = policy_plans("layernorm_residual")
    base = plans["elementwise"]
    seen = {}

    def measure(plan):  # the second candidate of every group is twice as fast as the first
        out = {}
        for g in plan.groups:
            first = next(p for p in base.groups if p.name == g.name).segments
            out[g.name] = 10.0 if g.segments == first else 5.0
            seen.setdefault(g.name, set()).add(g.segments)
        return out

    tuned = tune_plan(graph, base, device, 2, measure=measure, alternatives={})
    for g in tuned.groups:
        if len(seen[g.name]) > 1:
            assert g.measured_us == 5.0 and g.segments != next(p for p in base.groups if p.name == g.name).segments
    assert any(len(v) > 1 for v in seen.values())
    assert not validate(tuned, graph, device)


def test_a_tile_the_user_set_is_kept():
    """On the host, tuning re-coarsens its variants for the CPU; a tile set by a set_tile edit stays."""
    from engine.schedule.edits import apply_edit
    from engine.schedule.plan import Edit

    device = get_device("host")
    graph = load_graph(sample_path("layernorm_residual"))
    base = make_plan(graph, "elementwise", device)
    group = max(base.groups, key=lambda g: max((c.tile.blocks for c in g.candidates), default=0))
    mine = max(group.candidates, key=lambda c: c.tile.blocks).tile  # many small blocks: coarsening widens it
    user = apply_edit(base, graph, device, Edit.make("set_tile", stage=mine.stage, shape=list(mine.shape),
                                                     threads=mine.threads))
    assert user.group_of(mine.stage).segments[0].shape == mine.shape

    def measure(plan):  # anything but the user's tile is faster
        return {g.name: 10.0 if g.segments[0].shape == mine.shape else 1.0 for g in plan.groups}

    tuned = tune_plan(graph, user, device, 3, measure=measure, alternatives={})
    assert tuned.group_of(mine.stage).segments[0].shape == mine.shape
    assert not validate(tuned, graph, device)


def test_measurements_are_cached_by_subgraph_signature():
    device = get_device("a100")
    graph, plans = policy_plans("conv_bn_relu")
    calls: list[str] = []
    measure = timed(per_stage=0.2, calls=calls)
    alternatives = {p: pl for p, pl in plans.items() if p != "welder"}
    first = tune_plan(graph, plans["welder"], device, 2, measure=measure, alternatives=alternatives)
    assert calls
    calls.clear()

    def never(plan):
        raise AssertionError("measured again")

    again = tune_plan(graph, plans["welder"], device, 2, measure=never, alternatives=alternatives)
    assert again.groups == first.groups and not calls


def test_tune_on_a_gpu_preset_without_a_gpu_is_one_line():
    graph = load_graph(sample_path("gelu_chain"))
    from engine.runtime.cuda_driver import cuda_available

    if cuda_available()[0]:
        pytest.skip("a GPU is attached: tuning on it is the gpu-marked path")
    with pytest.raises(BackendError, match="--tune measures on the device and no GPU is attached"):
        plan_model(graph, "welder", "a100", tune=2)


def test_tuning_on_a_gpu_goes_through_the_cuda_launch_layer():
    """The GPU path end to end on the driver stand-in (tests/fake_cuda.py defines only functions the
    installed cuda.bindings.driver has; test_cuda_launch checks that): every variant compiled with NVRTC,
    loaded and launched, each kernel timed with events, and the plan rebuilt from those times."""
    from cuda.bindings import driver as real_driver
    from fake_cuda import API_NAMES, FakeDriver

    from engine.runtime.cuda_launch import open_gpu
    from engine.schedule.tune import device_measure

    assert all(hasattr(real_driver, name) for name in API_NAMES)
    device = get_device("a100")
    graph, plans = policy_plans("layernorm_residual")
    drv = FakeDriver(device="a100")
    measure = device_measure(graph, device, 2, gpu=open_gpu(drv, 0, 13000))
    alternatives = {p: pl for p, pl in plans.items() if p != "welder"}
    tuned = tune_plan(graph, plans["welder"], device, 2, measure=measure, alternatives=alternatives)
    assert not validate(tuned, graph, device)
    assert all(g.measured_us is not None and g.measured_us >= 0 for g in tuned.groups)
    launched = {c[2][0] for c in drv.calls("cuLaunchKernel") + drv.calls("cuLaunchCooperativeKernel")}
    assert {g.name for p in plans.values() for g in p.groups} <= launched  # every policy's kernels ran
    assert drv.calls("cuEventRecord")


@pytest.mark.parametrize("bad", [0, 9, -1, True, 2.5])
def test_tune_count_is_checked(bad):
    with pytest.raises(PlanError, match="--tune"):
        plan_model(load_graph(sample_path("gelu_chain")), "welder", "host", tune=bad)


def test_tuned_on_the_host_runs_and_matches_the_reference():
    from engine.api import run_model
    from engine.runtime.inputs import make_inputs

    graph = load_graph(sample_path("layernorm_residual"))
    planned, plan = plan_model(graph, "welder", "host", tune=2)
    assert plan.measured_us is not None and plan.measured_us > 0
    assert plan.decisions[-1].startswith("tune: whole programs measured")  # the host times them whole
    assert not validate(plan, planned, get_device("host"))
    inputs = make_inputs(graph, seed=5)
    got = run_model(planned, inputs, backend="cpu", plan=plan).outputs
    want = run_model(graph, inputs, backend="reference").outputs
    for name in want:
        assert max_rel_error(got[name], want[name]) <= 1e-4


def test_cli_tune(capsys, tmp_path):
    model = str(sample_path("masked_softmax"))
    assert main(["plan", model, "--device", "host", "--tune", "2"]) == 0
    out = capsys.readouterr().out
    assert "measured us" in out and "(--tune 2)" in out
    for argv, needle in ((["plan", model, "--tune", "0"], "--tune 0"),
                         (["run", model, "--backend", "cpu", "--tune", "2", "--plan-in", "p.json", "--outputs",
                           str(tmp_path / "o.npz")], "--tune applies when planning")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and needle in err and err.count("\n") == 1
