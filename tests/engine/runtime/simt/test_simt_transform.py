"""Tests for engine/runtime/simt/transform.py: pointer types become checked pointers, the dynamic shared memory
declaration becomes the block's shared memory, nothing else changes and every line stays where it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import CompileError
from engine.runtime.simt.transform import instrument

GOLDEN = Path(__file__).resolve().parents[3] / "golden"


@pytest.mark.parametrize("text, want", [
    ("const float* __restrict__ g_x", "tw::ptr<const float> __restrict__ g_x"),
    ("float* __restrict__ g_y", "tw::ptr<float> __restrict__ g_y"),
    ("float* s_a = (float*)(smem + 64);", "tw::ptr<float> s_a = (tw::ptr<float>)(smem + 64);"),
    ("unsigned char* tw_red = smem + 32;", "tw::ptr<unsigned char> tw_red = smem + 32;"),
    ("void** buf, unsigned* done", "tw::ptr<tw::ptr<void>> buf, tw::ptr<unsigned> done"),
    ("(const float*)buf[1]", "(tw::ptr<const float>)buf[1]"),
    ("const long long* g_i", "tw::ptr<const long long> g_i"),
    ("float* const* p", "tw::ptr<tw::ptr<float> const> p"),
    # not pointer types: products, casts to scalars, register arrays, comments and strings
    ("const float v = a * b;", "const float v = a * b;"),
    ("(float)x * y", "(float)x * y"),
    ("float acc[4][4];", "float acc[4][4];"),
    ("// float* in a comment", "// float* in a comment"),
    ('"float*"', '"float*"'),
])
def test_pointer_types_become_checked_pointers(text: str, want: str) -> None:
    assert instrument(text) == want


def test_dynamic_shared_memory_becomes_the_blocks_shared_memory() -> None:
    src = "void k() {\n    extern __shared__ __align__(16) unsigned char smem[];\n    float* s = (float*)(smem + 0);\n}\n"
    out = instrument(src).splitlines()
    assert out[1] == "    #define smem (tw::dynamic_shared<unsigned char>())"
    assert out[2] == "    tw::ptr<float> s = (tw::ptr<float>)(smem + 0);"


@pytest.mark.parametrize("decl, want", [
    ("extern __shared__ float4 buf[];  // the block's tiles", "#define buf (tw::dynamic_shared<float4>())"),
    ("extern __shared__ __align__(8) const unsigned int u[];", "#define u (tw::dynamic_shared<const unsigned int>())"),
])
def test_dynamic_shared_declarations_are_read_as_tokens(decl: str, want: str) -> None:
    """Read from the lexer's tokens: a trailing comment, no alignment or several type words; the line
    stays where it was, and the name it defines is what later lines use."""
    out = instrument(f"void k() {{\n\t{decl}\n    float x = 1.0f;\n}}\n").splitlines()
    assert out[1] == "\t" + want and out[2] == "    float x = 1.0f;" and len(out) == 4


def test_other_shared_memory_is_refused() -> None:
    with pytest.raises(CompileError, match="line 2 declares shared memory"):
        instrument("void k() {\n    __shared__ float s[64];\n}\n")
    with pytest.raises(CompileError, match="line 3 declares shared memory"):  # a shared array with a size
        instrument("// __shared__ in a comment is no declaration\nvoid k() {\n    extern __shared__ float s[4];\n}\n")


@pytest.mark.parametrize("name", ["layernorm_residual", "masked_softmax"])
def test_golden_kernels_keep_every_line_and_only_pointer_declarations_change(name: str) -> None:
    src = (GOLDEN / f"{name}.cu").read_text()
    out = instrument(src)
    assert out.count("\n") == src.count("\n")
    changed = [(a, b) for a, b in zip(src.splitlines(), out.splitlines()) if a != b]
    assert changed  # the signature and the shared-memory declarations at least
    for before, after in changed:
        assert "*" in before or "__shared__" in before, before
        assert "tw::" in after
    assert "__shared__" not in out
