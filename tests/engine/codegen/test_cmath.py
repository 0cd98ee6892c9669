"""The C backend's branch-free math helpers (engine/codegen/printer.py HELPERS c0_*/c1_*): accuracy
against float64 NumPy over wide random ranges and C's special cases, compiled exactly as the C
printer emits them (vectorised loops under the same header)."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from engine.codegen.ccompile import compile_c, load_library
from engine.codegen.printer import HELPERS
from engine.codegen.targets import C_HEADER

_UNARY = {"exp": "c0_expf", "log": "c0_logf", "tanh": "c1_tanhf", "erf": "c1_erff"}


@pytest.fixture(scope="module")
def lib():
    names = sorted(h for h in HELPERS if h.startswith(("c0_", "c1_")))
    body = [C_HEADER, *(f"static inline {HELPERS[h]}" for h in names)]
    for op, fn in _UNARY.items():
        body.append(f"void v_{op}(const float* restrict x, float* restrict y, int n) {{\n"
                    f"    #pragma omp simd\n    for (int i = 0; i < n; ++i) y[i] = {fn}(x[i]);\n}}")
    for op, q in (("sin", 0), ("cos", 1)):
        body.append(f"void v_{op}(const float* restrict x, float* restrict y, int n) {{\n"
                    f"    #pragma omp simd\n    for (int i = 0; i < n; ++i) y[i] = c0_sincosf(x[i], {q});\n}}")
    body.append("void v_pow(const float* restrict a, const float* restrict b, float* restrict y, int n) {\n"
                "    #pragma omp simd\n    for (int i = 0; i < n; ++i) y[i] = c1_powf(a[i], b[i]);\n}")
    return load_library(compile_c("\n".join(body), name="cmath_test"))


def _call(lib, name, *arrays):
    out = np.empty_like(arrays[0])
    args = [ctypes.c_void_p(a.ctypes.data) for a in (*arrays, out)] + [ctypes.c_int(out.size)]
    getattr(lib, name)(*args)
    return out


def _ulps(got: np.ndarray, want64: np.ndarray) -> float:
    with np.errstate(over="ignore"):
        want32 = want64.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want32))
    assert np.array_equal(np.isinf(got), np.isinf(want32)) and np.array_equal(got[np.isinf(got)], want32[np.isinf(want32)])
    ok = np.isfinite(want32) & (np.abs(want32) >= np.finfo(np.float32).tiny)
    ulp = np.spacing(np.abs(want32[ok])).astype(np.float64)
    return float((np.abs(got[ok].astype(np.float64) - want64[ok]) / ulp).max())


RNG = np.random.default_rng(11)
SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.625, 0.625, 1.0, -1.0, 88.7, 88.8, -87.3, -1e9, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("op,lo,hi,tol", [("exp", -100.0, 95.0, 1.5), ("tanh", -12.0, 12.0, 2.0),
                                          ("erf", -6.0, 6.0, 4.0), ("log", 0.0, 1e4, 1.5)])
def test_unary_helpers_are_within_a_few_ulps(lib, op, lo, hi, tol):
    x = np.concatenate([RNG.uniform(lo, hi, 50_000), RNG.standard_normal(50_000), SPECIAL]).astype(np.float32)
    if op == "log":
        x = np.concatenate([np.abs(x), [1e-40, 1e-45, 3e38]]).astype(np.float32)
    with np.errstate(all="ignore"):
        want = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": np.vectorize(math.erf)}[op](x.astype(np.float64))
    want[np.isnan(x)] = np.nan
    got = _call(lib, f"v_{op}", x)
    assert _ulps(got, np.asarray(want, np.float64)) <= tol


def test_pow_matches_c_special_cases_and_is_accurate(lib):
    a = np.concatenate([RNG.uniform(0, 10, 20_000), RNG.uniform(-5, 5, 2000),
                        [0, 0, 0, 1, 1, -2, -2, -8, 2, np.nan]]).astype(np.float32)
    b = np.concatenate([RNG.uniform(-3, 3, 20_000), np.round(RNG.uniform(-5, 5, 2000)),
                        [2.5, -1, 0, np.inf, 3, 3, 2, 1 / 3, 0.5, 0]]).astype(np.float32)
    got = _call(lib, "v_pow", a, b)
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want) & (np.abs(want) > 1e-30)
    assert np.max(np.abs(got[fin] - want[fin]) / np.abs(want[fin])) < 1e-5
    tail = got[-10:]
    assert list(tail[:7]) == [0.0, np.inf, 1.0, 1.0, 1.0, -8.0, 4.0]  # C powf's special cases
    assert np.isnan(tail[7]) and tail[8] == pytest.approx(math.sqrt(2), rel=1e-6) and tail[9] == 1.0


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_and_cos_are_within_a_few_ulps_of_one_where_the_reduction_is_exact(lib, op):
    """Absolute error within 2 float ulps of 1 for |x| up to 1e12 (the double reduction's products are exact),
    sin(±0) = ±0, sin(tiny) = tiny, NaN for inf and NaN, results in [-1, 1] past 1e15."""
    x = np.concatenate([RNG.uniform(-10, 10, 50_000), RNG.uniform(-1e4, 1e4, 50_000), RNG.uniform(-1e6, 1e6, 20_000),
                        RNG.uniform(-1e12, 1e12, 20_000),
                        np.arange(-64, 65) * (np.pi / 4), [0.0, -0.0, 1e-30, -1e-30, 1e-8]]).astype(np.float32)
    got = _call(lib, f"v_{op}", x)
    want = getattr(np, op)(x.astype(np.float64))
    assert np.abs(got.astype(np.float64) - want).max() <= 2 * np.spacing(np.float32(1.0))
    if op == "sin":
        tiny = np.array([0.0, -0.0, 1e-30, -1e-30], np.float32)
        got_tiny = _call(lib, "v_sin", tiny)
        assert np.array_equal(got_tiny, tiny) and np.signbit(got_tiny[1])
    odd = _call(lib, f"v_{op}", np.array([np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32))
    assert np.isnan(odd[:3]).all() and (np.abs(odd[3:]) <= 1).all()


def test_a_loop_of_sin_or_cos_vectorises(tmp_path):
    """The point of the helper: GCC vectorises a loop calling it under the C backend's options and header
    (libm's sinf, a call without -ffast-math's vector variants, ran one lane per element: nerf's encoding
    kernels). The header's no-trapping-math matters: without it GCC 12 if-converts the helper only where
    AVX-512 masks it (on an AVX2 machine the loop stayed scalar)."""
    import subprocess

    from engine.codegen.ccompile import default_options, find_compiler
    from engine.codegen.targets import C_HEADER

    version = subprocess.run([*find_compiler(), "--version"], capture_output=True, text=True).stdout
    if "gcc" not in version.lower() and "free software foundation" not in version.lower():
        pytest.skip("-fopt-info is GCC's; the compiler here is another")
    src = tmp_path / "sincos.c"
    text = (C_HEADER + "static inline __attribute__((always_inline)) " + HELPERS["c0_sincosf"] + "\n"
            "void f(const float* restrict a, float* restrict b, int n) {\n    #pragma omp simd\n"
            "    for (int i = 0; i < n; ++i) b[i] = c0_sincosf(a[i], 1);\n}\n")
    src.write_text(text)
    line = text[:text.index("for (int i = 0; i < n;")].count("\n") + 1  # the loop's, not the header's
    options = [o for o in default_options() if o != "-shared"]
    done = subprocess.run([*find_compiler(), *options, "-c", str(src), "-o", str(tmp_path / "sincos.o"),
                           "-fopt-info-vec-optimized"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert any(f"sincos.c:{line}:" in x and "loop vectorized" in x for x in done.stderr.splitlines()), done.stderr
