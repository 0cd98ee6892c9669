"""Compile a Program for a target: sources per kernel (CUDA: one translation unit per program, PTX
and CUBIN per arch through NVRTC; C: one shared library through the system compiler)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.codegen.kir import Program, program_to_json
from engine.codegen.targets import render_c, render_cuda
from engine.errors import CompileError

TARGETS = ("cuda", "c")


@dataclass(frozen=True)
class CompiledProgram:
    target: str
    source: str
    arch: str = ""  # cuda only
    ptx: str = ""
    cubin: bytes = b""
    library: str = ""  # c only: path of the shared library


def compile_program(program: Program, target: str, *, arch: str = "sm_80") -> CompiledProgram:
    """Render and compile `program` for `target` ("cuda" for `arch`, or "c")."""
    if target == "cuda":
        from engine.codegen.nvrtc import compile_cuda

        source = render_cuda(program)
        binary = compile_cuda(source, name=program.name, arch=arch)
        return CompiledProgram("cuda", source, arch, binary.ptx, binary.cubin)
    if target == "c":
        from engine.codegen.ccompile import compile_c

        source = render_c(program)
        return CompiledProgram("c", source, library=str(compile_c(source, name=program.name)))
    raise CompileError(f"unknown target '{target}' (choose one of {', '.join(TARGETS)})")


def write_compiled(program: Program, compiled: CompiledProgram, out: Path) -> list[Path]:
    """program.json, the source, and for CUDA the .ptx/.cubin of the program module plus one .cu per
    kernel (the kernel alone, for reading); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    ext = "cu" if compiled.target == "cuda" else "c"
    path = out / f"{program.name}.{ext}"
    path.write_text(compiled.source)
    written.append(path)
    if compiled.target == "cuda":
        for suffix, data in (("ptx", compiled.ptx.encode()), ("cubin", compiled.cubin)):
            p = out / f"{program.name}.{compiled.arch}.{suffix}"
            p.write_bytes(data)
            written.append(p)
    meta = program_to_json(program) | {"target": compiled.target, "arch": compiled.arch,
                                       "source": path.name}
    p = out / "program.json"
    p.write_text(json.dumps(meta, indent=1))
    written.append(p)
    return written
