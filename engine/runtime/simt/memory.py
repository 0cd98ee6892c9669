"""Tensors as the emulator sees them: NumPy arrays registered as runtime buffers, with shadow cells (never
written / last write / last read) for the ones kernels write, and the shared-memory regions of a kernel
found on the printed lines that declare them (so `s_x[i]` is bounded by s_x, not all of shared memory)."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

import numpy as np

from engine.codegen.kir import Kernel
from engine.runtime.simt import native

HOST = 0xFFFFFFFE  # tw::HOST: the writer of a cell the host initialised
HOST_WORD = 1  # Cell = {Access w, r}, Access = {g, block, ...}: w.block is the cell's second 32-bit word


def shift_of(itemsize: int) -> int:
    """log2 of a granule: shadow cells per element of the smallest type a buffer holds."""
    return max(0, int(itemsize).bit_length() - 1)


class Memory:
    """Owns runtime Buffer handles and the arrays behind them; `close()` frees the handles."""

    def __init__(self) -> None:
        self.rt = native.runtime()
        self.cell = self.rt.tw_cell_size()
        self.handles: dict[str, int] = {}
        self.arrays: dict[str, np.ndarray] = {}
        self.shadows: dict[str, tuple[np.ndarray, int, int]] = {}  # name -> (shadow bytes, first cell, cells)
        self._keep: list = []

    def add(self, name: str, array: np.ndarray, *, tracked: bool, shadow: tuple[np.ndarray, int] | None = None,
            shift: int | None = None, written: bool = False) -> int:
        """Register `array` under `name`. Tracked buffers get shadow cells (never written, or written by
        the host before the launch with `written`), their own or a slice of `shadow` = (shadow array,
        first cell) shared with aliasing tensors (the arena)."""
        shift = shift_of(array.dtype.itemsize) if shift is None else shift
        base = array.ctypes.data
        cells = ((array.nbytes - 1) >> shift) + 1 if array.nbytes else 0
        shadow_ptr = None
        if tracked:
            if shadow is None:
                shadow = (np.full(max(cells, 1) * self.cell, 0xFF, np.uint8), 0)
            self.shadows[name] = (shadow[0], shadow[1], cells)
            if written:
                self.mark_written(name)
            shadow_ptr = shadow[0].ctypes.data + shadow[1] * self.cell
        label = name.encode()
        handle = self.rt.tw_buffer_new(base, array.nbytes, shadow_ptr, shift, native.GLOBAL, label)
        self.handles[name] = handle
        self.arrays[name] = array
        self._keep.append(array)
        return handle

    def forget(self, name: str) -> None:
        """Mark every cell of a tracked tensor never written (a fresh tensor in reused arena memory)."""
        if name in self.shadows:
            arr, first, cells = self.shadows[name]
            arr[first * self.cell:(first + cells) * self.cell] = 0xFF

    def mark_written(self, name: str) -> None:
        """Every cell of a tracked buffer written by the host (ordered before every kernel access)."""
        arr, first, cells = self.shadows[name]
        words = arr[first * self.cell:(first + cells) * self.cell].view(np.uint32).reshape(cells, -1)
        words[:, HOST_WORD] = HOST

    def arg(self, name: str) -> native.Arg:
        return native.Arg(self.arrays[name].ctypes.data, self.handles[name])

    def close(self) -> None:
        for handle in self.handles.values():
            self.rt.tw_buffer_free(handle)
        self.handles.clear()


def garbage(shape, dtype) -> np.ndarray:
    """An uninitialised device tensor: every byte 0xFF (NaN for floats), so reads of it show in values too."""
    arr = np.empty(shape, dtype)
    arr.reshape(-1).view(np.uint8)[:] = 0xFF  # flat first: numpy cannot view a 0-d array as bytes
    return arr


@dataclass(frozen=True)
class SharedRegion:
    line: int  # 1-based line of the cast that declares the buffer
    offset: int
    size: int
    name: str


_DECL = re.compile(r"^\s*(?:const\s+)?[\w ]+?\*\s*(\w+)\s*=\s*\([\w ]+\*\)\(\s*(?:smem|tw_smem)\s*\+\s*(\d+)\s*\);")
_RED = re.compile(r"^\s*[\w ]+?\*\s*red\s*=\s*\([\w ]+\*\)\s*tw_red\s*;")


def shared_regions(kernel: Kernel, lines: list[str], lo: int = 0, hi: int | None = None) -> list[SharedRegion]:
    """Regions of the kernel's dynamic shared memory, keyed by the printed line that casts each one out of
    it (lines lo..hi of `lines`): BLOCK buffers, the GEMM/conv staging tiles st_a/st_b, and the cross-warp
    reduction slots (8 bytes per warp of the kernel's own thread count)."""
    sizes = {b.name: b.nbytes for b in kernel.locals}
    a, b = kernel.staging_bytes
    sizes.update({"st_a": a, "st_b": b, "st_ha": a, "st_hb": b, "st_ba": a, "st_bb": b})  # fp32/fp16/bf16 views
    out = []
    for n in range(lo, len(lines) if hi is None else hi):
        m = _DECL.match(lines[n])
        if m and m[1] in sizes:
            out.append(SharedRegion(n + 1, int(m[2]), sizes[m[1]], m[1]))
        elif kernel.reduce_scratch_bytes and _RED.match(lines[n]):
            at = kernel.shared_bytes - kernel.reduce_scratch_bytes
            out.append(SharedRegion(n + 1, at, 8 * -(-kernel.threads // 32), "tw_red"))
    return out


def region_table(regions: list[SharedRegion]) -> tuple[ctypes.Array, list]:
    """The regions as the runtime's TwRegion array (and the name bytes it points at, to keep alive)."""
    names = [r.name.encode() for r in regions]
    table = (native.Region * max(1, len(regions)))()
    for k, (r, nm) in enumerate(zip(regions, names)):
        table[k] = native.Region(r.line, 0, r.offset, r.size, nm)
    return table, names


def smem_shift(kernels) -> int:
    """Granule of shared-memory shadow cells: the smallest element any block buffer or staging tile
    holds (floats for the reduction slots)."""
    sizes = [b.dtype.itemsize for k in kernels for b in k.locals] + [d.itemsize for k in kernels for d in k.staging_dtypes]
    sizes.append(4)
    return shift_of(min(sizes))
