"""The emulator's native side: runtime.cpp built once (cached) and loaded for every kernel library to link
against, its C API as ctypes structures, and the printed CUDA units compiled into one cached library."""

from __future__ import annotations

import ctypes
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from engine.codegen.ccompile import compile_c, load_library
from engine.flags import sim_stack_kib
from engine.runtime.simt.transform import instrument

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"
RUNTIME = HERE / "runtime.cpp"
# -ffp-contract=off rounds like the NumPy reference (no fused multiply-adds); -w: warnings about printed
# code are NVRTC's business, not the emulator's. Kernels build at -O1: the checks they call live in the
# runtime (-O2), and -O2 only made compiling slower (lstm unfused's 99 kernels: 11 s -> 8 s at -O1).
OPTIONS = ("-std=c++17", "-fPIC", "-shared", "-w", "-ffp-contract=off", "-fno-math-errno",
           "-fvisibility=hidden", "-fvisibility-inlines-hidden")
GLOBAL, SHARED = 0, 1


class Arg(ctypes.Structure):
    """A kernel argument, and the layout of tw::ptr<T>: address and the buffer it may address."""

    _fields_ = [("p", ctypes.c_void_p), ("b", ctypes.c_void_p)]


class Region(ctypes.Structure):
    _fields_ = [("line", ctypes.c_int32), ("pad", ctypes.c_int32), ("offset", ctypes.c_int64),
                ("size", ctypes.c_int64), ("name", ctypes.c_char_p)]


class LaunchDesc(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("args", ctypes.c_void_p), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("smem_bytes", ctypes.c_int64), ("smem_shift", ctypes.c_int32),
                ("cooperative", ctypes.c_int32), ("resident", ctypes.c_int32), ("nregions", ctypes.c_int32),
                ("regions", ctypes.c_void_p), ("kernel", ctypes.c_char_p)]


class RawFinding(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("line", ctypes.c_int32), ("prev_line", ctypes.c_int32),
                ("pad", ctypes.c_int32), ("count", ctypes.c_int64), ("offset", ctypes.c_int64),
                ("block", ctypes.c_uint32 * 3), ("thread", ctypes.c_uint32 * 3), ("buffer", ctypes.c_char * 64),
                ("message", ctypes.c_char * 256)]


@functools.cache
def abi() -> str:
    """Hash of the prelude headers and the runtime: part of every library's build options (cache key)."""
    h = hashlib.sha256()
    for path in sorted(INCLUDE.glob("*.h")) + [RUNTIME]:
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]


def _options(level: str = "-O1") -> tuple[str, ...]:
    return (*OPTIONS, level, f"-I{INCLUDE}", f"-DTW_SIMT_ABI={abi()}")


@functools.cache
def runtime() -> ctypes.CDLL:
    """The runtime library, loaded globally so kernel libraries resolve tw_* against it."""
    path = compile_c(RUNTIME.read_text(), name="tw_simt_runtime", options=(*_options("-O2"), "-fno-semantic-interposition"), cxx=True)
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    sig = {
        "tw_cell_size": (ctypes.c_int, []),
        "tw_set_stack_size": (None, [ctypes.c_int64]),
        "tw_buffer_new": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                                            ctypes.c_int, ctypes.c_char_p]),
        "tw_buffer_free": (None, [ctypes.c_void_p]),
        "tw_stats": (None, [ctypes.POINTER(ctypes.c_uint64)]),
        "tw_findings": (ctypes.c_int, [ctypes.POINTER(RawFinding), ctypes.c_int]),
        "tw_launch": (ctypes.c_int, [ctypes.POINTER(LaunchDesc)]),
    }
    for fn, (res, args) in sig.items():
        getattr(lib, fn).restype = res
        getattr(lib, fn).argtypes = args
    lib.tw_set_stack_size(sim_stack_kib() * 1024)
    return lib


@dataclass(frozen=True)
class Unit:
    """One printed CUDA translation unit: its file name (findings name its lines), the kernel to enter
    and the printed source."""

    file: str
    kernel: str
    source: str

    @property
    def lines(self) -> list[str]:
        return self.source.splitlines()


@dataclass(frozen=True)
class SimLibrary:
    units: tuple[Unit, ...]
    library: object  # ctypes.CDLL
    entries: tuple[int, ...]  # address of each unit's entry trampoline

    def entry(self, kernel: str) -> tuple[Unit, int]:
        for unit, address in zip(self.units, self.entries):
            if unit.kernel == kernel:
                return unit, address
        raise KeyError(kernel)


def program_source(units: tuple[Unit, ...]) -> str:
    """One C++ file: the prelude, each unit instrumented in its own namespace (so their helpers do not
    clash) under `#line 1 "FILE"`, and an entry trampoline per unit that binds the kernel's arguments."""
    parts = ['#include "tw_simt.h"', "#include <cuda_fp16.h>", "#include <cooperative_groups.h>"]
    for k, u in enumerate(units):
        parts += [f"namespace tw_u{k} {{", f'#line 1 "{u.file}"', instrument(u.source), "}"]
    parts.append('#line 1 "tw_entries.cpp"')
    for k, u in enumerate(units):
        parts.append(f'extern "C" __attribute__((visibility("default"))) void tw_entry_{k}(const tw::Arg* a) {{ tw::invoke(&tw_u{k}::{u.kernel}, a); }}')
    return "\n".join(parts) + "\n"


def build(units: tuple[Unit, ...], name: str) -> SimLibrary:
    """Compile (or fetch from the cache) the units as one library and load it."""
    runtime()
    lib = load_library(compile_c(program_source(units), name=f"{name}_sim", options=_options(), cxx=True))
    entries = tuple(ctypes.cast(getattr(lib, f"tw_entry_{k}"), ctypes.c_void_p).value for k in range(len(units)))
    return SimLibrary(units, lib, entries)
