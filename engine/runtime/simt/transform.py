"""Printed CUDA source in, the same source with its pointers checked out, for g++ and the cuda-sim prelude.

This is a front end, not a printer: cuda-sim runs CUDA source as NVRTC would take it (the CUDA printer's,
a persistent kernel's, a saved failure's `.cu`), so it lowers CUDA to C++ over a lexer's tokens, the way
a compiler reads its input; the printers never patch what they emitted (docs/architecture.md).
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

def instrument(source: str) -> str:
    """The printed source with checked pointers and dynamic shared memory (see the module docstring)."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(source)]
    out: list[str] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        if text == "__shared__":
            line = 1 + sum(t.count("\n") for _, t in tokens[:i])
            raise CompileError(f"cuda-sim: line {line} declares shared memory other than `extern __shared__ T name[];`",
                               hint="the emulator supports the dynamic shared memory the CUDA printer emits")
        if text == "extern" and _line_start(tokens, i):
            shared = _dynamic_shared(tokens, i)
            if shared is not None:
                text, i = shared
                out.append(text)
                continue
        if kind == "word" and (text in TYPE_WORDS or text in CV):
            rewritten = _pointer_type(tokens, i)
            if rewritten is not None:
                text, i = rewritten
                out.append(text)
                continue
        out.append(text)
        i += 1
    return "".join(out)


def _line_start(tokens: list[tuple[str, str]], i: int) -> bool:
    """Whether only blanks precede token i on its line (a directive may replace it)."""
    j = i - 1
    while j >= 0 and tokens[j][0] == "space" and tokens[j][1] != "\n":
        j -= 1
    return j < 0 or tokens[j][1] == "\n"


def _dynamic_shared(tokens: list[tuple[str, str]], start: int) -> tuple[str, int] | None:
    """(`#define name (tw::dynamic_shared<T>())`, index of the line's newline) for the declaration
    `extern __shared__ [__align__(N)] T name[];` (then only a comment) starting at `start`; None
    otherwise. Only this line's tokens are read: a directive ends at its newline."""
    sig, j = [], start
    while j < len(tokens) and tokens[j][1] != "\n":
        if tokens[j][0] not in ("space", "comment"):
            sig.append(tokens[j])
        j += 1
    text = [t for _, t in sig]
    if text[:2] != ["extern", "__shared__"]:
        return None
    rest, kinds = text[2:], [k for k, _ in sig[2:]]
    if rest[:2] == ["__align__", "("] and len(rest) > 3 and rest[3] == ")" and kinds[2] == "number":
        rest, kinds = rest[4:], kinds[4:]
    if len(rest) < 5 or rest[-3:] != ["[", "]", ";"] or any(k != "word" for k in kinds[:-3]):
        return None
    *words, name = rest[:-3]
    return f"#define {name} (tw::dynamic_shared<{' '.join(words)}>())", j


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
