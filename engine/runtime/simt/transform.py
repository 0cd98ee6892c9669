"""Printed CUDA source in, the same source with its pointers checked out, for g++ and the cuda-sim prelude.

Two token-level rewrites, both keeping every line where it was (findings name the printed line):
- a pointer type, i.e. scalar type words (with const/volatile) followed by `*`, becomes `tw::ptr<...>`
  (`const float* __restrict__ g_x` -> `tw::ptr<const float> __restrict__ g_x`, `(float*)(smem + 64)` ->
  `(tw::ptr<float>)(smem + 64)`, `void** buf` -> `tw::ptr<tw::ptr<void>> buf`) in declarations and casts;
- `extern __shared__ [__align__(N)] T name[];` (alone on its line) becomes `#define name
  (tw::dynamic_shared<T>())`: the running block's dynamic shared memory.
Everything else (built-ins, __syncthreads, shuffles, grid sync, atomics) is defined by the prelude."""

from __future__ import annotations

import re

from engine.errors import CompileError

TYPE_WORDS = frozenset({
    "void", "bool", "char", "short", "int", "long", "float", "double", "signed", "unsigned", "half", "__half",
    "__nv_bfloat16", "size_t", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t",
    "uint64_t", "float2", "float4",
})
CV = frozenset({"const", "volatile"})

_TOKEN = re.compile(r"""
    (?P<pp>^[ \t]*\#[^\n]*)
  | (?P<space>[ \t\r\f\v]+|\n)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<word>[A-Za-z_]\w*)
  | (?P<number>\.?\d(?:[\w.]|[eEpP][+-])*)
  | (?P<punct>.)
""", re.X | re.S | re.M)

_SHARED_DECL = re.compile(
    r"^(?P<indent>[ \t]*)extern[ \t]+__shared__[ \t]+(?:__align__\(\d+\)[ \t]+)?(?P<type>[A-Za-z_][\w \t]*?)"
    r"[ \t]+(?P<name>[A-Za-z_]\w*)[ \t]*\[[ \t]*\][ \t]*;[ \t]*(?://[^\n]*)?$", re.M)


def instrument(source: str) -> str:
    """The printed source with checked pointers and dynamic shared memory (see the module docstring)."""
    out = _SHARED_DECL.sub(lambda m: f"{m['indent']}#define {m['name']} (tw::dynamic_shared<{m['type'].strip()}>())",
                           source)
    if "__shared__" in _strip_comments(out):
        line = next(i for i, text in enumerate(out.splitlines(), 1) if "__shared__" in text)
        raise CompileError(f"cuda-sim: line {line} declares shared memory other than `extern __shared__ T name[];`",
                           hint="the emulator supports the dynamic shared memory the CUDA printer emits")
    return _rewrite_pointers(out)


def _strip_comments(source: str) -> str:
    return "".join(m.group() for m in _TOKEN.finditer(source) if m.lastgroup != "comment")


def _rewrite_pointers(source: str) -> str:
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(source)]
    out: list[str] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "word" and (text in TYPE_WORDS or text in CV):
            rewritten = _pointer_type(tokens, i)
            if rewritten is not None:
                text, i = rewritten
                out.append(text)
                continue
        out.append(text)
        i += 1
    return "".join(out)


def _pointer_type(tokens: list[tuple[str, str]], start: int) -> tuple[str, int] | None:
    """(`tw::ptr<...>` text, index after the declarator's stars) for the type starting at `start`, or
    None when the words there are not followed by `*` (a plain scalar type, or not a type at all)."""
    words, i, seen_type, newlines = [], start, False, 0
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "space":
            newlines += text == "\n"
            i += 1
            continue
        if kind == "word" and (text in TYPE_WORDS or text in CV):
            seen_type |= text in TYPE_WORDS
            words.append(text)
            i += 1
            continue
        break
    if not seen_type or i >= len(tokens) or tokens[i][1] != "*":
        return None
    result = " ".join(words)
    while i < len(tokens) and tokens[i][1] == "*":
        result = f"tw::ptr<{result}>"
        i += 1
        quals = []
        j = i
        while j < len(tokens) and (tokens[j][0] == "space" or tokens[j][1] in CV):
            if tokens[j][1] in CV:
                quals.append(tokens[j][1])
            j += 1
        if j < len(tokens) and tokens[j][1] == "*":  # `T* const*`: the qualifier belongs to the inner pointer
            result += "".join(f" {q}" for q in quals)
            i = j
    return result + "\n" * newlines, i  # lines stay where they were
