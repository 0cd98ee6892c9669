"""engine/runtime/cuda_modules.py, the CUDA executor and the bundle's run_cuda.py load one module per
kernel the same way: CUBIN for the GPU's arch, else the newest older PTX; hashes checked; launches with
dynamic shared memory and cooperative launch. No GPU: a stand-in driver records what would happen."""

from __future__ import annotations

import io
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from engine.codegen.api import compile_program, compiled_files, program_json
from engine.codegen.generate import generate
from engine.errors import BackendError
from engine.frontend.importer import load_graph
from engine.runtime import cuda as cuda_runtime
from engine.runtime.cuda_modules import LoadError, choose_binary, launch_kernel, load_kernels
from engine.schedule.policies import make_plan

SAMPLES = Path(__file__).resolve().parents[3] / "samples"


class FakeFunction:
    def __init__(self, name, data):
        self.name, self.data, self.calls, self.attributes = name, data, [], {}

    def set_attribute(self, attr, value):
        self.attributes[attr] = value

    def __call__(self, *args, grid, block, shared):
        self.calls.append(("launch", len(args), grid, block, shared))


class FakeModule:
    def __init__(self, data):
        self.data = data

    def get_function(self, name):
        # A real module only has the kernels its binary defines.
        marker = f".entry {name}(".encode() if self.data[:4] != b"\x7fELF" else name.encode()
        if marker not in self.data:
            raise KeyError(f"no function {name} in this module")
        return FakeFunction(name, self.data)


class FakeDriver(types.SimpleNamespace):
    """What the loader needs of pycuda.driver."""

    def __init__(self, cooperative=True):
        super().__init__(loaded=[], function_attribute=types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="max_dyn"))
        if cooperative:
            self.launch_cooperative_kernel = self._coop

    def module_from_buffer(self, data):
        self.loaded.append(bytes(data))
        return FakeModule(bytes(data))

    @staticmethod
    def _coop(fn, grid, block, args, shared_mem_bytes):
        fn.calls.append(("cooperative", len(args), grid, block, shared_mem_bytes))


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
    drv = FakeDriver()
    functions = load_kernels(drv, meta, files.__getitem__, device_arch)
    assert list(functions) == [k.name for k in program.kernels]
    assert len(drv.loaded) == len(program.kernels)  # one module per kernel
    for k, data in zip(program.kernels, drv.loaded):
        if kind == "cubin":
            assert data == files[f"{k.name}.{built}.cubin"]
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
    with pytest.raises(LoadError) as info:
        load_kernels(FakeDriver(), meta, files.__getitem__, "sm_75")
    message = str(info.value)
    assert "\n" not in message and program.kernels[0].name in message and "--arch sm_75" in message
    name = f"{program.kernels[0].name}.sm_80.cubin"
    tampered = dict(files, **{name: files[name][:-1] + b"\1"})
    with pytest.raises(LoadError, match=f"{name} does not match its sha256"):
        load_kernels(FakeDriver(), meta, tampered.__getitem__, "sm_80")


def test_launch_passes_shared_bytes_opts_in_above_48k_and_launches_cooperatively():
    fn = FakeFunction("k", b"")
    drv = FakeDriver()
    launch_kernel(drv, fn, {"kernel": "k", "grid": 7, "block": 128, "shared_bytes": 1024, "cooperative": False}, [1, 2])
    assert fn.calls[-1] == ("launch", 2, (7, 1), (128, 1, 1), 1024) and not fn.attributes
    launch_kernel(drv, fn, {"kernel": "k", "grid": 7, "block": 128, "shared_bytes": 64 * 1024, "cooperative": True}, [1])
    assert fn.calls[-1] == ("cooperative", 1, (7, 1, 1), (128, 1, 1), 64 * 1024)
    assert fn.attributes == {"max_dyn": 64 * 1024}
    with pytest.raises(LoadError, match="k needs a cooperative launch"):
        launch_kernel(FakeDriver(cooperative=False), fn, {"kernel": "k", "grid": 1, "block": 32, "shared_bytes": 0,
                                                           "cooperative": True}, [])


def test_executor_builds_for_the_gpu_or_the_newest_older_arch():
    supported = ("sm_75", "sm_80", "sm_86", "sm_90")
    assert cuda_runtime.build_arch("sm_86", supported) == "sm_86"
    assert cuda_runtime.build_arch("sm_120", supported) == "sm_90"
    with pytest.raises(BackendError, match="sm_70"):
        cuda_runtime.build_arch("sm_70", supported)


def test_executor_loads_per_kernel_modules_like_the_bundle(compiled, monkeypatch):
    program, _, _ = compiled
    monkeypatch.setattr("engine.codegen.nvrtc.supported_archs", lambda: ("sm_75", "sm_80", "sm_90"))
    drv = FakeDriver()
    meta, functions = cuda_runtime.load_program(drv, program, "sm_86")  # no sm_86 build: sm_80 PTX
    assert list(functions) == [k.name for k in program.kernels] == [k["name"] for k in meta["kernels"]]
    assert all(b"\n.target sm_80" in data and data.endswith(b"\0") for data in drv.loaded)


def _bundle_dir(tmp_path):
    from engine.bundle.export import export_bundle

    graph = load_graph(SAMPLES / "layernorm_residual.onnx")
    data = export_bundle(graph, make_plan(graph, "welder", "a100"), "a100", with_weights=False)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        z.extractall(tmp_path)
    return tmp_path


def test_bundled_runner_embeds_the_same_loader(compiled, tmp_path):
    folder = _bundle_dir(tmp_path)
    namespace = {"__name__": "run_cuda", "__file__": str(folder / "run_cuda.py")}
    exec(compile((folder / "run_cuda.py").read_text(), "run_cuda.py", "exec"), namespace)
    import json

    meta = json.loads((folder / "program.json").read_text())
    for arch in ("sm_80", "sm_86", "sm_90"):
        drv = FakeDriver()
        namespace["load_kernels"](drv, meta, lambda name: (folder / name).read_bytes(), arch)
        ours = FakeDriver()
        load_kernels(ours, compiled[2], compiled[1].__getitem__, arch)
        assert drv.loaded == ours.loaded  # the same bytes per kernel, in the same order


def test_bundled_runner_without_pycuda_is_one_line(tmp_path):
    folder = _bundle_dir(tmp_path)
    np.savez(folder / "in.npz", x=np.random.default_rng(0).standard_normal(4).astype(np.float32))
    env_path = tmp_path / "nopycuda"
    env_path.mkdir()
    (env_path / "pycuda").mkdir()
    (env_path / "pycuda" / "__init__.py").write_text("raise ImportError('libcuda.so.1: cannot open shared object file')\n")
    proc = subprocess.run([sys.executable, "run_cuda.py", "in.npz", "out.npz"], cwd=folder, capture_output=True,
                          text=True, env={"PYTHONPATH": str(env_path), "PATH": "/usr/bin:/bin"})
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: pycuda with a CUDA device"), err
