"""Tests for engine/codegen/nvrtc.py: compile-only (no GPU), errors, disk cache, CLI entry."""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.codegen import nvrtc
from engine.codegen.nvrtc import CudaBinary, compile_cuda, ptx_isa_version
from engine.errors import CompileError

# Everything generated kernels lean on: shared memory, block barrier, warp shuffle, grid barrier, half.
KERNEL = r"""
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void k01_sum_half(const half* __restrict__ x, float* __restrict__ partial,
                                        float* __restrict__ out, int n) {
    __shared__ float warp_sums[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? __half2float(x[i]) : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < (blockDim.x + 31) / 32; ++w) s += warp_sums[w];
        partial[blockIdx.x] = s;
    }
    cg::this_grid().sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0.0f;
        for (int b = 0; b < gridDim.x; ++b) s += partial[b];
        out[0] = s;
    }
}
"""

TINY = 'extern "C" __global__ void k00_scale(float* x, float a) { x[threadIdx.x] *= a; }\n'

EM_CUDA = 190  # ELF e_machine of NVIDIA CUBINs


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernel_compiles_to_ptx_and_cubin(arch: str) -> None:
    binary = compile_cuda(KERNEL, name="k01_sum_half", arch=arch)
    assert isinstance(binary, CudaBinary)
    assert binary.arch == arch and binary.nvrtc_version == nvrtc.nvrtc_version()
    assert f".target {arch}" in binary.ptx
    assert ".entry k01_sum_half" in binary.ptx
    assert "shfl.sync.down" in binary.ptx and "bar.sync" in binary.ptx
    assert binary.cubin[:4] == b"\x7fELF"
    assert struct.unpack_from("<H", binary.cubin, 18)[0] == EM_CUDA
    assert b"k01_sum_half" in binary.cubin
    assert "-std=c++17" in binary.options and "--use_fast_math" not in binary.options


def test_ptx_loads_on_cuda_13_0_drivers() -> None:
    # A CUDA 13.0 driver JIT-loads PTX ISA up to 9.0; a newer NVRTC would silently raise this.
    binary = compile_cuda(TINY, name="k00_scale", arch="sm_80")
    major, minor = (int(p) for p in ptx_isa_version(binary.ptx).split("."))
    assert (major, minor) <= (9, 0)
    assert binary.ptx_isa == ptx_isa_version(binary.ptx)


def test_ptx_isa_version_parses_directive() -> None:
    assert ptx_isa_version("//\n// comment\n\n.version 8.7\n.target sm_90\n") == "8.7"
    with pytest.raises(ValueError):
        ptx_isa_version(".target sm_90\n")


def test_syntax_error_names_kernel_line_and_repro(tmp_path) -> None:
    source = TINY + "__global__ void k02_bad(float* x) {\n    float y = ;\n    x[0] = z;\n}\n"
    with pytest.raises(CompileError) as info:
        compile_cuda(source, name="k02_bad", arch="sm_80")
    err = info.value
    message = str(err)
    assert "\n" not in message
    assert "k02_bad" in message and "sm_80" in message
    assert "k02_bad.cu(3): error" in message  # the line number of `float y = ;`
    assert "(+1 more)" in message
    assert "python -m engine.codegen.nvrtc" in message
    assert 'identifier "z" is undefined' in err.log  # the full log rides on the exception
    assert err.source_path.read_text() == source
    assert str(err.source_path) in message


def test_cache_hit_does_not_call_nvrtc(monkeypatch) -> None:
    first = compile_cuda(TINY, name="k00_scale", arch="sm_80")

    def fail(*args, **kwargs):
        raise AssertionError("NVRTC called on a cache hit")

    monkeypatch.setattr(nvrtc, "_run_nvrtc", fail)
    again = compile_cuda(TINY, name="k00_scale", arch="sm_80")
    assert again == first
    # Anything that changes the binary must miss: options, arch, source.
    with pytest.raises(AssertionError, match="cache hit"):
        compile_cuda(TINY, name="k00_scale", arch="sm_80", options=("-lineinfo",))
    with pytest.raises(AssertionError, match="cache hit"):
        compile_cuda(TINY, name="k00_scale", arch="sm_90")
    with pytest.raises(AssertionError, match="cache hit"):
        compile_cuda(TINY + "\n", name="k00_scale", arch="sm_80")


def test_damaged_cache_entry_is_recompiled(tmp_path) -> None:
    first = compile_cuda(TINY, name="k00_scale", arch="sm_80")
    (entry,) = (tmp_path / "cache" / "nvrtc").glob("*.json")
    entry.write_text("{not json")
    assert compile_cuda(TINY, name="k00_scale", arch="sm_80") == first


def test_parallel_compiles_of_one_kernel_share_one_entry(tmp_path) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: compile_cuda(TINY, name="k00_scale", arch="sm_80"), range(4)))
    assert all(r == results[0] for r in results)
    folder = tmp_path / "cache" / "nvrtc"
    assert len(list(folder.glob("*.json"))) == 1
    assert not list(folder.glob(".*.tmp"))


def test_unsupported_arch_and_arch_option_are_rejected() -> None:
    with pytest.raises(CompileError, match="sm_70 is not supported.*sm_75"):
        compile_cuda(TINY, name="k00_scale", arch="sm_70")
    with pytest.raises(CompileError, match="form sm_80"):
        compile_cuda(TINY, name="k00_scale", arch="compute_80")
    with pytest.raises(CompileError, match='arch="sm_80"'):
        compile_cuda(TINY, name="k00_scale", options=("-arch=sm_90",))


def test_missing_nvrtc_library_names_the_pip_package(monkeypatch) -> None:
    import cuda.pathfinder

    def not_found(libname):
        raise cuda.pathfinder.DynamicLibNotFoundError(f"{libname} not found")

    monkeypatch.setattr(cuda.pathfinder, "load_nvidia_dynamic_lib", not_found)
    nvrtc.nvrtc_version.cache_clear()
    try:
        with pytest.raises(CompileError, match=r"pip install nvidia-cuda-nvrtc==13\.0\.88"):
            compile_cuda(TINY, name="k00_scale")
    finally:
        monkeypatch.undo()
        nvrtc.nvrtc_version.cache_clear()


def test_cli_entry_compiles_a_file_and_reports_errors(tmp_path, capsys) -> None:
    good = tmp_path / "k00_scale.cu"
    good.write_text(TINY)
    assert nvrtc.main([str(good), "--arch", "sm_90", "--out", str(tmp_path / "out")]) == 0
    assert "PTX ISA" in capsys.readouterr().out
    assert (tmp_path / "out" / "k00_scale.cubin").read_bytes()[:4] == b"\x7fELF"
    assert ".target sm_90" in (tmp_path / "out" / "k00_scale.ptx").read_text()

    bad = tmp_path / "k02_bad.cu"
    bad.write_text("__global__ void k02_bad() { int x = ; }\n")
    assert nvrtc.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "expected an expression" in err and "error: kernel k02_bad failed" in err


def test_speed_options_change_no_byte(monkeypatch) -> None:
    """SPEED_OPTIONS (precompiled headers) are left out of the cache key: they must not change the output.
    Two units with the same prelude, so the second one is compiled through the precompiled header."""
    other = KERNEL.replace("k01_sum_half", "k03_sum_half_again")
    fast = [compile_cuda(src, name=n, arch="sm_90", use_cache=False)
            for src, n in ((KERNEL, "k01_sum_half"), (other, "k03_sum_half_again"))]
    monkeypatch.setattr(nvrtc, "SPEED_OPTIONS", ())
    plain = [compile_cuda(src, name=n, arch="sm_90", use_cache=False)
             for src, n in ((KERNEL, "k01_sum_half"), (other, "k03_sum_half_again"))]
    assert [(b.ptx, b.cubin) for b in fast] == [(b.ptx, b.cubin) for b in plain]
    assert "precompiled header" not in fast[1].log


def test_a_kernel_that_fails_only_with_the_precompiled_header_is_compiled_without_it(monkeypatch, capsys) -> None:
    """On a real H200 (image NVRTC 13.0.88, its toolkit's CCCL headers) two persistent kernels failed with
    -pch ('identifier "__forceinline__int" is undefined') that compile here: the PCH must never be the
    reason a kernel fails."""
    real = nvrtc._run_nvrtc
    calls = []

    def pch_breaks(source, name, options):
        calls.append("-pch" in options)
        if "-pch" in options:
            return False, "", b"", 'probe.cu(7): error: identifier "__forceinline__int" is undefined'
        return real(source, name, options)

    monkeypatch.setattr(nvrtc, "_run_nvrtc", pch_breaks)
    binary = compile_cuda(TINY, name="k00_scale", arch="sm_90")
    assert calls == [True, False] and binary.cubin[:4] == b"\x7fELF"
    assert "compiled without -pch" in binary.log and "__forceinline__int" in binary.log
    assert "failed with -pch" in capsys.readouterr().err
    with pytest.raises(CompileError, match="k00_broken failed to compile for sm_90: .*error"):
        compile_cuda("this is not CUDA", name="k00_broken", arch="sm_90")


def test_precompiled_headers_of_a_process_that_did_not_exit_normally_are_removed_by_the_next(tmp_path) -> None:
    """NVRTC deletes its automatic precompiled headers when a process exits normally; one ended by os._exit or
    a signal (pytest-xdist's workers, a worker past its time limit) left 100-300 MB in /tmp each (9.8 GB had
    piled up on the development machine). They go to the process's own folder under the cache instead, and
    the next process that compiles removes the folders of processes that are gone."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / "nvrtc" / "pch"
    compile_and = ("from engine.codegen import nvrtc\n"
                   f"nvrtc.compile_cuda({KERNEL!r}, name='k01_sum_half', arch='sm_90', use_cache=False)\n"
                   "import os, sys; print(os.getpid()); sys.stdout.flush()\n")
    env = os.environ | {"TILEWEAVE_CACHE": str(tmp_path)}
    repo = Path(__file__).resolve().parents[3]
    crashed = subprocess.run([sys.executable, "-c", compile_and + "os._exit(0)\n"], env=env, cwd=repo,
                             capture_output=True, text=True, check=True)
    pid = int(crashed.stdout.split()[-1])
    left = [p for p in root.iterdir() if p.name.endswith(f"-{pid}")]
    assert len(left) == 1 and list(left[0].glob("*.pch")), "its headers stay in its own folder"
    assert not list(Path("/tmp").glob(f"__nvrtc_auto_pch_{pid}_*")), "and nowhere else"
    subprocess.run([sys.executable, "-c", compile_and], env=env, cwd=repo, capture_output=True, check=True)
    assert not left[0].exists()
