"""engine/host.py: the host CPU as a device — probed figures with their provenance, the per-machine cache,
the plan a host device gets (coarsened tiles in the plan, no one-wave rule), and `run --backend cpu`
planning for it by default."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from support import max_rel_error, sample_path

import engine.host as host
from engine.cli import main
from engine.device import Device, get_device
from engine.errors import DeviceError

TIMED = ("dram_bw_bytes_per_s", "l2_bw_bytes_per_s", "smem_bw_bytes_per_s", "peak_fp32_flops", "elementwise_flops",
         "plain_flops", "launch_overhead_s", "grid_barrier_s")


@pytest.fixture(scope="module")
def device() -> Device:
    return get_device("host")


def test_figures_are_this_machines_and_say_where_they_came_from(device):
    assert device.kind == "cpu" and device.name == "host"
    assert device.sm_count == host.host_threads()
    assert device.vector_lanes in (4, 8, 16)
    caches = host.cache_sizes()
    if caches:
        assert device.l2_bytes == caches[max(caches)]
    # Timed figures are plausible for any CPU of the last decade, and labelled measured.
    assert 1e8 < device.dram_bw_bytes_per_s <= device.l2_bw_bytes_per_s <= device.smem_bw_bytes_per_s < 1e14
    assert 1e8 < device.elementwise_flops < device.peak_fp32_flops < 1e14
    assert device.elementwise_flops < device.plain_flops < 1e14  # math functions cost more per counted flop
    assert 0 < device.launch_overhead_s < 1e-3 and 0 < device.grid_barrier_s < 1e-3
    for key in TIMED:
        assert device.source_of(key) == "measured", key
    for key in ("sm_count", "l2_bytes", "memory_bytes", "vector_lanes", "kind"):
        assert device.source_of(key) == "detected", key
    assert Device.from_json(device.to_json()) == device


def test_cached_per_machine_and_thread_count(tmp_path, monkeypatch, device):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    monkeypatch.setattr(host, "_LOADED", {})
    calls = []

    def fake_probe(threads):  # the figures of a real probe, so only the caching is under test
        calls.append(threads)
        return Device.from_dict(device.to_dict() | {"sm_count": threads})

    monkeypatch.setattr(host, "probe_host", fake_probe)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    first = host.host_device()
    assert calls == [3] and first.sm_count == 3 and host.cache_path().exists()
    monkeypatch.setattr(host, "_LOADED", {})  # a new process: read back from the file, no probe
    assert host.host_device() == first and calls == [3]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # another thread count is another device
    assert host.host_device().sm_count == 1 and calls == [3, 1]
    host.cache_path().write_text("{ damaged")
    monkeypatch.setattr(host, "_LOADED", {})
    assert host.host_device().sm_count == 1 and calls == [3, 1, 1]  # probed again, not an error
    assert host.host_device(refresh=True) and calls == [3, 1, 1, 1]


def test_a_pass_taken_under_interference_does_not_set_the_figures(monkeypatch):
    """Each timed figure is the best over the probe's passes: one pass slowed by another tenant's load (a
    third of the bandwidth, twice the launch cost) leaves the cached figures as the quiet passes read them."""
    quiet = {"dram_bw": 2.4e10, "llc_bw": 7.5e10, "l1_bw": 3.0e11, "peak": 1.1e11, "launch": 2e-7, "barrier": 3e-9}
    loaded = {k: v / 3 if k.endswith("_bw") or k == "peak" else v * 2 for k, v in quiet.items()}
    passes = iter([loaded, quiet, loaded])
    monkeypatch.setattr(host, "_timed_figures", lambda *a: next(passes))
    monkeypatch.setattr(host, "PROBE_GAP_S", 0.0)
    monkeypatch.setattr(host, "_codegen_rates", lambda device: (1.0e11, 7.9e9, 4.0e10))
    device = host.probe_host(1)
    assert next(passes, None) is None  # every pass was taken
    assert (device.dram_bw_bytes_per_s, device.l2_bw_bytes_per_s, device.smem_bw_bytes_per_s) == (2.4e10, 7.5e10, 3.0e11)
    assert (device.launch_overhead_s, device.grid_barrier_s) == (2e-7, 3e-9)
    assert device.description.endswith("FMA peak 110 GFLOP/s")

def test_the_pools_figures_are_timed_before_the_openmp_triads(monkeypatch):
    """A pass times the pool's grid barrier and launch first: right after the OpenMP triads, OpenMP's own
    threads still spin and share the cores with the pool's, and a pooled loop's end measured ~3 us against
    ~0.4 (this VM, 2 threads) — a figure every later plan's grid barriers were priced at. The stand-in
    library records the probe functions called (each defined in the probe's C)."""
    calls = []

    class Recorder:
        def __getattr__(self, name):
            assert re.search(rf"\b(double|void) {name}\(", host._PROBE_C), name

            def call(*args):
                calls.append(name)
                return 1e-3
            return call

    monkeypatch.setenv("TILEWEAVE_C_LOOPS", "pool")
    monkeypatch.setattr(host, "_time_launch", lambda fn: 2e-7)
    host._timed_figures(Recorder(), 2, 32 * 1024, 32 << 20, 16)
    assert calls[0] == "tw_pool_barrier" and {"tw_triad", "tw_triad_private", "tw_fma"} <= set(calls[1:])


def test_bad_thread_count_is_one_line(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")
    with pytest.raises(DeviceError, match="OMP_NUM_THREADS='lots' is not a thread count"):
        host.host_threads()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("kind", "tpu", "'kind' must be one of gpu, cpu"),
    ("vector_lanes", 0, "'vector_lanes' must be an integer from 1 to 64"),
    ("elementwise_flops", float("nan"), "'elementwise_flops' must be a number"),
    ("plain_flops", -1, "'plain_flops' must be a number"),
    ("description", "x" * 300, "'description' must be a string of at most 200"),
])
def test_device_files_check_the_cpu_fields(tmp_path, key, value, message):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"base": "a100", key: value}))
    with pytest.raises(DeviceError, match=message):
        get_device(path)


def test_host_plans_hold_the_tiles_the_c_target_runs(device):
    from engine.api import load_graph
    from engine.codegen.generate import generate
    from engine.schedule.pipeline import plan_model
    from engine.schedule.validate import validate

    graph = load_graph(sample_path("conv_bn_relu"))
    graph, plan = plan_model(graph, "welder", device)
    assert not validate(plan, graph, device)
    program = generate(plan, graph, device, target="c")
    assert [k.ntiles for k in program.kernels] == [g.blocks for g in plan.groups]
    # The same plan for a GPU preset would be coarsened by codegen; the host's already is.
    _, gpu_plan = plan_model(load_graph(sample_path("conv_bn_relu")), "welder", "a100")
    assert sum(g.blocks for g in plan.groups) < sum(g.blocks for g in gpu_plan.groups)
    assert all(g.cost is not None and g.cost.modeled_us > 0 for g in plan.groups)


def test_grid_barriers_need_no_single_wave_on_the_host():
    # The C target runs a grid barrier's segments one OpenMP loop after another; a GPU needs every block
    # resident. The same one-SM device refuses a two-block grid barrier as a GPU and takes it as a CPU.
    from engine.api import load_graph
    from engine.schedule.pipeline import plan_model
    from engine.schedule.validate import _check_wave
    from engine.tilegraph.tilegraph import segments_of

    # rtx3090: the welder walk's plan for bert_layer is kept there, with grid-barrier kernels
    graph, plan = plan_model(load_graph(sample_path("bert_layer")), "welder", "rtx3090")
    conns = {e.key: e.conn for e in plan.edges}
    group = next(g for g in plan.groups if len(g.segments) > 1 and g.blocks > 1)
    segs = segments_of(graph, group.stages, conns)
    tiny = get_device("a100").to_dict() | {"name": "tiny", "sm_count": 1, "max_blocks_per_sm": 1}
    gpu, cpu = Device.from_dict(tiny), Device.from_dict(tiny | {"kind": "cpu"})
    [violation] = _check_wave(graph, segs, conns, group.segments, gpu, group.name)
    assert violation.rule == "global_sync_wave"
    assert _check_wave(graph, segs, conns, group.segments, cpu, group.name) == []


def test_run_backend_cpu_plans_for_the_host_by_default(tmp_path, capsys):
    from engine.api import load_graph, run_model
    from engine.runtime.inputs import make_inputs

    graph = load_graph(sample_path("gelu_chain"))
    inputs = make_inputs(graph, seed=3)
    result = run_model(graph, inputs, backend="cpu", policy="welder")
    assert result.program.device == "host"
    want = run_model(graph, inputs, backend="reference").outputs
    assert max_rel_error(result.outputs["y"], want["y"]) <= 1e-4
    # A plan made for a GPU preset runs as that plan, translated for the CPU, not checked against the host.
    from engine.schedule.pipeline import plan_model

    planned, gpu_plan = plan_model(graph, "welder", "a100")
    assert run_model(planned, inputs, backend="cpu", plan=gpu_plan).program.device == "a100"
    io = sample_path("gelu_chain").with_suffix(".io.npz")
    assert main(["run", str(sample_path("gelu_chain")), "--backend", "cpu", "--inputs", str(io),
                 "--outputs", str(tmp_path / "o.npz")]) == 0
    assert max_rel_error(np.load(tmp_path / "o.npz")["y"], np.load(io)["y"]) <= 1e-4


def test_device_command_prints_every_figure_with_its_source(capsys):
    assert main(["device"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("host: ") and "cached in " in out
    line = next(x for x in out.splitlines() if x.split()[:1] == ["dram_bw_bytes_per_s"])
    assert line.split()[-1] == "measured"
    assert main(["device", "a100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "a100"
    assert main(["device", "a100", "--refresh"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --refresh probes the host") and err.count("\n") == 1


def test_a_probe_on_a_busy_machine_says_so(monkeypatch, tmp_path, capsys):
    # The probe's figures are cached for every later plan: one taken while other work shares the cores
    # must say so, with the command that replaces it. (os.getloadavg is the real function, stood in for.)
    import engine.host as host

    monkeypatch.setattr(host.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(host.os, "getloadavg", lambda: (0.3, 0.2, 0.1))
    assert host._busy_before_probe() == ""
    monkeypatch.setattr(host.os, "getloadavg", lambda: (6.5, 4.0, 2.0))
    assert host._busy_before_probe() == "the load average was 6.5 on 2 CPUs"
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    host.host_device(refresh=True)
    assert capsys.readouterr().err == ""  # not a terminal: scripts and tests read stderr for errors
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    host.host_device(refresh=True)
    err = capsys.readouterr().err
    assert err.startswith("warning: host figures measured while the load average was 6.5 on 2 CPUs")
    assert "tileweave device host --refresh" in err and err.count("\n") == 1
