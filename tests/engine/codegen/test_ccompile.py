"""Tests for engine/codegen/ccompile.py: OpenMP C to a cached shared library, errors, cache."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from engine.codegen import ccompile
from engine.codegen.ccompile import DEFAULT_OPTIONS, compile_c, load_library
from engine.errors import CompileError, PlanError

ADD = r"""
#include <omp.h>
#include <stdint.h>

void k00_add(const float* a, const float* b, float* out, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

int k00_threads(void) { return omp_get_max_threads(); }
"""

FLOAT_P = ctypes.POINTER(ctypes.c_float)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path / "cache"))


def _bind_add(lib: ctypes.CDLL):
    fn = lib.k00_add
    fn.argtypes = [FLOAT_P, FLOAT_P, FLOAT_P, ctypes.c_int64]
    fn.restype = None
    return fn


def test_openmp_add_runs_on_random_arrays(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    path = compile_c(ADD, name="k00_add")
    assert path.suffix == ".so" and path.exists()
    lib = load_library(path)
    rng = np.random.default_rng(0)
    n = 100_003  # odd size: the last chunk of the parallel loop is partial
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    out = np.full(n, np.nan, dtype=np.float32)  # NaN: an unwritten element cannot pass
    _bind_add(lib)(a.ctypes.data_as(FLOAT_P), b.ctypes.data_as(FLOAT_P), out.ctypes.data_as(FLOAT_P), n)
    np.testing.assert_array_equal(out, a + b)
    lib.k00_threads.restype = ctypes.c_int
    assert lib.k00_threads() >= 1  # linked against the OpenMP runtime


def test_default_options_are_portable_and_strict() -> None:
    assert "-fopenmp" in DEFAULT_OPTIONS and "-ffp-contract=off" in DEFAULT_OPTIONS
    assert not any("native" in opt for opt in DEFAULT_OPTIONS)


def test_cache_hit_runs_no_compiler(monkeypatch) -> None:
    first = compile_c(ADD, name="k00_add")

    def fail(*args, **kwargs):
        raise AssertionError("compiler called on a cache hit")

    monkeypatch.setattr(ccompile, "run_worker", fail)  # how compile_c starts the compiler
    assert compile_c(ADD, name="k00_add") == first
    with pytest.raises(AssertionError, match="cache hit"):
        compile_c(ADD, name="k00_add", options=(*DEFAULT_OPTIONS, "-O2"))
    with pytest.raises(AssertionError, match="cache hit"):
        compile_c(ADD + "\n", name="k00_add")


def test_native_options_are_keyed_on_the_host(monkeypatch) -> None:
    portable = compile_c(ADD, name="k00_add", options=(*DEFAULT_OPTIONS, "-march=x86-64"))
    native_opts = (*DEFAULT_OPTIONS, "-mtune=native")
    native = compile_c(ADD, name="k00_add", options=native_opts)
    assert native != portable
    monkeypatch.setattr(ccompile, "_host_fingerprint", lambda: "another-cpu")
    # The same options on another CPU must not reuse this CPU's binary.
    monkeypatch.setattr(ccompile, "run_worker", lambda *a, **k: (_ for _ in ()).throw(AssertionError("compiled")))
    with pytest.raises(AssertionError, match="compiled"):
        compile_c(ADD, name="k00_add", options=native_opts)


def test_compile_error_names_program_first_error_and_command() -> None:
    source = "int k01_bad(int x) {\n    return x +;\n}\n"
    with pytest.raises(CompileError) as info:
        compile_c(source, name="k01_bad")
    err = info.value
    message = str(err)
    assert "\n" not in message
    assert "k01_bad" in message
    assert ":2:" in message and "error" in message  # file:line of the bad expression
    assert "reproduce:" in message and "-fopenmp" in message and str(err.source_path) in message
    assert err.source_path.read_text() == source
    assert "error" in err.log
    # The printed command really reproduces the failure.
    repro = message.split("reproduce: ", 1)[1]
    assert subprocess.run(repro, shell=True, capture_output=True).returncode != 0


def test_missing_compiler(monkeypatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(ccompile.shutil, "which", lambda name: None)
    with pytest.raises(CompileError, match=r"no C compiler found: install gcc \(apt-get install gcc\) or set CC"):
        compile_c(ADD, name="k00_add")


def test_cc_env_is_honoured(monkeypatch) -> None:
    monkeypatch.setenv("CC", "definitely-not-a-compiler-xyz")
    with pytest.raises(CompileError, match="CC="):
        compile_c(ADD, name="k00_add")
    monkeypatch.setenv("CC", "gcc")
    assert compile_c(ADD, name="k00_add").exists()


def test_load_library_error_is_compile_error(tmp_path) -> None:
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(CompileError, match="cannot load"):
        load_library(junk)


def test_default_build_targets_the_host_where_the_compiler_can(monkeypatch, tmp_path) -> None:
    """compile_c builds for the host CPU (-march=native, cache keyed on the host) when the compiler
    accepts it, and with the portable options when it does not."""
    opts = ccompile.default_options()
    assert opts[:len(DEFAULT_OPTIONS)] == DEFAULT_OPTIONS and set(opts) - set(DEFAULT_OPTIONS) <= {"-march=native"}
    picky = tmp_path / "picky-cc"  # a compiler that refuses -march=native, otherwise gcc
    picky.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -march=native ] && exit 1; done\nexec gcc "$@"\n')
    picky.chmod(0o755)
    monkeypatch.setenv("CC", str(picky))
    assert ccompile.default_options() == DEFAULT_OPTIONS
    lib = load_library(compile_c(ADD, name="k00_add"))
    a = np.random.default_rng(1).standard_normal(1000, dtype=np.float32)
    out = np.full_like(a, np.nan)
    _bind_add(lib)(a.ctypes.data_as(FLOAT_P), a.ctypes.data_as(FLOAT_P), out.ctypes.data_as(FLOAT_P), a.size)
    np.testing.assert_array_equal(out, a + a)


def test_an_edit_recompiles_only_the_kernels_whose_code_changed(tmp_path):
    """compile_c_kernels builds one cached object per kernel: after an edit that fuses one edge of an
    unfused plan, the other kernels (renumbered after the merge) come from the object cache, and the
    library still computes what the reference does."""
    import functools
    import shutil

    from support import sample_path

    from engine.api import apply_edit, generate, load_graph, make_inputs, run_reference
    from engine.codegen.ccompile import UNIT_SYMBOL, compile_c_kernels
    from engine.codegen.kir import PROGRAM_ENTRY
    from engine.codegen.targets import render_c, render_c_units
    from engine.device import get_device
    from engine.runtime.cpu import CpuModule, run_cpu
    from engine.schedule.plan import Edit
    from engine.schedule.policies import make_plan

    if shutil.which("objcopy") is None:
        pytest.skip("binutils' objcopy not installed: compile_c_kernels builds the program whole")
    graph = load_graph(sample_path("masked_softmax"))
    device = get_device("a100")
    before = make_plan(graph, "unfused", device)
    after = None
    for e in reversed(before.edges):  # the last edge that may be fused on its own
        try:
            after = apply_edit(before, graph, device, Edit.make("set_edge", producer=e.producer,
                                                                consumer=e.consumer, conn="shared"))
            break
        except PlanError:
            continue
    assert after.kernels == before.kernels - 1
    objects = tmp_path / "cache" / "cc" / "obj"
    inputs = make_inputs(graph, seed=4)
    want = run_reference(graph, inputs)
    built = []
    for plan in (before, after):
        program = generate(plan, graph, "a100")
        source = render_c(program)
        prelude, units = render_c_units(program, UNIT_SYMBOL)
        assert len(units) == plan.kernels + 1 and units[-1][0] == PROGRAM_ENTRY  # the kernels, then the entry
        assert all(UNIT_SYMBOL in text and kernel not in text for kernel, text in units[:-1])
        assert UNIT_SYMBOL not in units[-1][1] and "#include" not in units[-1][1]  # own name, no prelude
        assert prelude + "".join(text.replace(UNIT_SYMBOL, kernel) for kernel, text in units) == source
        path = compile_c_kernels(source, name=program.name, units=functools.partial(render_c_units, program, UNIT_SYMBOL))
        built.append(len(list(objects.glob("*.o"))))
        module = CpuModule(program, source, load_library(path), str(path))
        got, _ = run_cpu(module, graph.specs, inputs, graph.weights)
        for onnx_name in graph.output_names:
            np.testing.assert_allclose(got[onnx_name], want[onnx_name], rtol=1e-5, atol=1e-6)
    assert built[0] == before.kernels  # the entry is compiled in the link step, not cached as an object
    assert built[1] - built[0] <= 2  # the merged kernel (and at most one neighbour whose code moved)
