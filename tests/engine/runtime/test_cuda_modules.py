"""engine/runtime/cuda_modules.py, the CUDA executor and the bundle's run_bundle.py load one module per
kernel the same way (CUBIN for the GPU's arch, else the newest older PTX; hashes checked) and run the
launch list with the same rules. No GPU: the stand-in driver (tests/fake_cuda.py) records what happens."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeDriver

from engine.codegen.api import compile_program, compiled_files, program_json
from engine.codegen.generate import generate
from engine.device import get_device, resident_blocks_per_sm
from engine.errors import BackendError
from engine.frontend.importer import load_graph
from engine.runtime import cuda as cuda_runtime
from engine.runtime.cuda_launch import open_gpu
from engine.runtime.cuda_modules import LoadError, choose_binary, load_kernels, run_launches
from engine.schedule.policies import make_plan

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


def _gpu(device: str = "a100"):
    drv = FakeDriver(device=device)
    return open_gpu(drv, 0, 13000), drv


@pytest.fixture(scope="module")
def compiled():
    graph = load_graph(SAMPLES / "layernorm_residual.onnx")
    program = generate(make_plan(graph, "welder", "a100"), graph)
    result = compile_program(program, "cuda", archs=("sm_80", "sm_90"))
    files = compiled_files(program, result)
    return program, files, program_json(program, result, files)


@pytest.mark.parametrize("device_arch, kind, built", [
    ("sm_80", "cubin", "sm_80"), ("sm_90", "cubin", "sm_90"),
    ("sm_86", "ptx", "sm_80"), ("sm_89", "ptx", "sm_80"), ("sm_100", "ptx", "sm_90"), ("sm_120", "ptx", "sm_90"),
])
def test_each_kernel_gets_its_own_module_cubin_else_older_ptx(compiled, device_arch, kind, built):
    program, files, meta = compiled
    gpu, drv = _gpu()
    functions = load_kernels(gpu, meta, files.__getitem__, device_arch)
    assert list(functions) == [k.name for k in program.kernels]
    assert len(drv.modules) == len(program.kernels)  # one module per kernel
    for k, data in zip(program.kernels, drv.modules.values()):
        if kind == "cubin":
            assert data == files[f"{k.name}.{built}.cubin"]
            # The driver's register count is the compiled one program.json records.
            by_name = {m["name"]: m for m in meta["kernels"]}
            assert functions[k.name].registers == by_name[k.name]["resources"][built]["registers"]
        else:  # PTX goes in NUL-terminated, from the newest arch the GPU can JIT forward from
            assert data == files[f"{k.name}.{built}.ptx"] + b"\0" and f".target {built}".encode() in data
        assert functions[k.name].name == k.name


def test_choose_binary_never_picks_newer_ptx_or_a_suffixed_arch():
    binaries = {"sm_80": {}, "sm_90a": {}, "sm_90": {}}
    assert choose_binary(binaries, "sm_90a") == ("cubin", "sm_90a")
    assert choose_binary(binaries, "sm_100") == ("ptx", "sm_90")
    assert choose_binary({"sm_90": {}}, "sm_80") is None


def test_no_loadable_binary_or_a_changed_file_is_one_line(compiled):
    program, files, meta = compiled
    gpu, _ = _gpu()
    with pytest.raises(LoadError) as info:
        load_kernels(gpu, meta, files.__getitem__, "sm_75")
    message = str(info.value)
    assert "\n" not in message and program.kernels[0].name in message and "--arch sm_75" in message
    name = f"{program.kernels[0].name}.sm_80.cubin"
    tampered = dict(files, **{name: files[name][:-1] + b"\1"})
    with pytest.raises(LoadError, match=f"{name} does not match its sha256"):
        load_kernels(gpu, meta, tampered.__getitem__, "sm_80")


def test_executor_builds_for_the_gpu_or_the_newest_older_arch():
    supported = ("sm_75", "sm_80", "sm_86", "sm_90")
    assert cuda_runtime.build_arch("sm_86", supported) == "sm_86"
    assert cuda_runtime.build_arch("sm_120", supported) == "sm_90"
    with pytest.raises(BackendError, match="sm_70"):
        cuda_runtime.build_arch("sm_70", supported)


def test_executor_runs_a_cooperative_program_with_grids_from_the_attached_devices_occupancy():
    # Stitch puts layernorm_residual's reductions behind grid barriers: cooperative kernels. Planned for
    # a100 but run on an "h100": the grid follows the attached device and the compiled registers.
    graph = load_graph(SAMPLES / "layernorm_residual.onnx")
    program = generate(make_plan(graph, "stitch", "a100"), graph)
    assert any(ln.cooperative for ln in program.launches)
    gpu, drv = _gpu("h100")
    rng = np.random.default_rng(5)
    inputs = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in graph.inputs}
    outs, profile = cuda_runtime.run_cuda(program, graph.specs, inputs, graph.weights, gpu=gpu, repeat=2)
    assert set(outs) == set(graph.output_names) and profile.label.startswith("measured on Fake H100")
    assert [k.kernel for k in profile.kernels] == [ln.kernel for ln in program.launches]
    assert all(k.runs == 2 for k in profile.kernels)
    coop = drv.calls("cuLaunchCooperativeKernel")
    assert coop  # every launch of a cooperative kernel went through cuLaunchCooperativeKernel
    h100 = get_device("h100")
    regs = {f["name"]: f["registers"] for f in drv.functions.values()}
    for _, _, (name, grid, block, shared, params) in coop:
        kernel = program.kernel(name)
        per_sm, _ = resident_blocks_per_sm(h100, block, regs[name], shared)
        assert grid == min(kernel.ntiles, per_sm * h100.sm_count)
        assert len(params[0]) == len(kernel.params)
    assert sorted(drv.unloaded) == sorted(drv.modules)  # a long-lived app does not pile up modules
    # Inputs reached the device as given.
    uploads = [c for c in drv.calls("cuMemcpyHtoD")]
    assert len(uploads) == len(program.inputs) + len(program.constants)


def test_run_launches_refuses_a_missing_or_misshapen_input_in_one_line(compiled):
    program, files, meta = compiled
    gpu, _ = _gpu()
    functions = load_kernels(gpu, meta, files.__getitem__, "sm_80")
    with pytest.raises(LoadError, match="missing input 'x'"):
        run_launches(gpu, meta, functions, {})
    with pytest.raises(LoadError, match=r"input 'x' has shape \[3\]"):
        run_launches(gpu, meta, functions, {"x": np.ones(3, np.float32)})


def _bundle_dir(tmp_path):
    from engine.bundle.export import export_bundle

    graph = load_graph(SAMPLES / "layernorm_residual.onnx")
    data = export_bundle(graph, make_plan(graph, "welder", "a100"), "a100", with_weights=False)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        z.extractall(tmp_path)
    return tmp_path


def test_bundled_runner_embeds_the_same_launch_layer(compiled, tmp_path):
    folder = _bundle_dir(tmp_path)
    namespace = {"__name__": "run_bundle", "__file__": str(folder / "run_bundle.py")}
    exec(compile((folder / "run_bundle.py").read_text(), "run_bundle.py", "exec"), namespace)
    meta = json.loads((folder / "program.json").read_text())
    for arch in ("sm_80", "sm_86", "sm_90"):
        theirs = FakeDriver()
        namespace["load_kernels"](namespace["open_gpu"](theirs, 0, 13000), meta,
                                  lambda name: (folder / name).read_bytes(), arch)
        ours = FakeDriver()
        load_kernels(open_gpu(ours, 0, 13000), compiled[2], compiled[1].__getitem__, arch)
        assert list(theirs.modules.values()) == list(ours.modules.values())  # same bytes, same order
    from engine.runtime import cuda_launch, cuda_modules

    for fn in ("prepare_launch", "run_launches", "choose_binary"):
        assert namespace[fn].__code__.co_code == getattr(cuda_modules, fn).__code__.co_code
    assert namespace["Gpu"].launch.__code__.co_code == cuda_launch.Gpu.launch.__code__.co_code


def test_bundled_runner_without_cuda_python_is_one_line(tmp_path):
    folder = _bundle_dir(tmp_path)
    np.savez(folder / "in.npz", x=np.random.default_rng(0).standard_normal(4).astype(np.float32))
    shadow = tmp_path / "nocuda"
    (shadow / "cuda").mkdir(parents=True)
    (shadow / "cuda" / "__init__.py").write_text("raise ImportError('cuda-bindings is not installed')\n")
    proc = subprocess.run([sys.executable, "run_bundle.py", "--inputs", "in.npz", "--outputs", "out.npz",
                           "--backend", "cuda"], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(shadow)})
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: cuda-python is not installed"), err


def test_program_time_runs_the_whole_launch_list_between_two_events():
    # --program-time (bench_cost_model on a GPU): besides each kernel alone, the launch list back to back,
    # every launch of the program between one pair of events, in program order, `repeat` times.
    graph = load_graph(SAMPLES / "layernorm_residual.onnx")
    program = generate(make_plan(graph, "stitch", "a100"), graph)
    gpu, drv = _gpu("h100")
    rng = np.random.default_rng(11)
    inputs = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in graph.inputs}
    _, alone = cuda_runtime.run_cuda(program, graph.specs, inputs, graph.weights, gpu=gpu, repeat=3)
    assert alone.program_us is None and "program_us" not in alone.to_json()
    drv.log.clear()
    _, profile = cuda_runtime.run_cuda(program, graph.specs, inputs, graph.weights, gpu=gpu, repeat=3,
                                       program_time=True)
    assert profile.program_us == pytest.approx(250.0)  # the stand-in's 0.25 ms per event pair
    assert profile.to_json()["program_us"] == pytest.approx(250.0)
    names = [ln.kernel for ln in program.launches]
    log = [c for c in drv.log if c[0] in ("cuEventRecord", "cuLaunchKernel", "cuLaunchCooperativeKernel")]
    records = [i for i, c in enumerate(log) if c[0] == "cuEventRecord"]
    # the last 3 event pairs bracket whole programs
    whole = [log[a + 1:b] for a, b in zip(records[-6::2], records[-5::2])]
    assert len(whole) == 3 and all([c[2][0] for c in run] == names for run in whole)
    assert len(drv.memory) == 0  # every buffer of both passes freed
