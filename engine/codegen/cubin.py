"""CUBIN bytes (an NVIDIA ELF) in, per-kernel compiled resources out: registers per thread, local
(stack) bytes per thread and static shared bytes, read from the `.nv.info` attributes, no GPU needed.

The registers feed the occupancy model (`resident_blocks_per_sm`) when no GPU is attached; with one,
the launcher asks the driver (`cuFuncGetAttribute`, `cuOccupancyMaxActiveBlocksPerMultiprocessor`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# `.nv.info` holds records: format byte, attribute byte, then a 16-bit field that is the payload size
# for EIFMT_SVAL (payload follows) and the value itself for the other formats.
EIFMT_SVAL = 0x04
EIATTR_FRAME_SIZE = 0x11  # payload: symbol index, bytes of the function's stack frame (local memory)
EIATTR_REGCOUNT = 0x2F  # payload: symbol index, registers per thread
_ELF_MAGIC = b"\x7fELF"


class CubinError(ValueError):
    """Bytes that are not a 64-bit little-endian ELF with NVIDIA's `.nv.info` attributes."""


@dataclass(frozen=True)
class KernelResources:
    """What the compiler allotted one kernel: the inputs of the occupancy calculation."""

    name: str
    registers: int
    local_bytes: int  # stack frame per thread (spills, local arrays)
    static_shared_bytes: int  # `__shared__` arrays; dynamic shared memory is given at launch

    def to_json(self) -> dict:
        return {"registers": self.registers, "local_bytes": self.local_bytes,
                "static_shared_bytes": self.static_shared_bytes}


@dataclass(frozen=True)
class _Section:
    name: str
    info: int
    data: bytes
    size: int  # sh_size: a NOBITS section (.nv.shared.*) has a size but no bytes in the file


def _sections(elf: bytes) -> list[_Section]:
    if elf[:4] != _ELF_MAGIC or len(elf) < 64 or elf[4] != 2 or elf[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF (a CUBIN starts with 7f 45 4c 46 02 01)")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shentsize < 64 or shoff + shnum * shentsize > len(elf):
        raise CubinError("ELF section header table runs past the end of the file")
    raw = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size, _link, info = struct.unpack_from("<IIQQQQII", elf,
                                                                                 shoff + i * shentsize)
        data = b"" if kind == 8 else elf[offset:offset + size]  # SHT_NOBITS has no file bytes
        raw.append((name, info, data, size))
    names = raw[shstrndx][2] if shstrndx < len(raw) else b""

    def text(at: int) -> str:
        end = names.find(b"\0", at)
        return names[at:end if end >= 0 else len(names)].decode(errors="replace")

    return [_Section(text(n), info, data, size) for n, info, data, size in raw]


def _symbols(sections: list[_Section]) -> list[str]:
    """Symbol names by index (.symtab entries are 24 bytes; their names live in .strtab)."""
    by_name = {s.name: s for s in sections}
    symtab, strtab = by_name.get(".symtab"), by_name.get(".strtab")
    if symtab is None or strtab is None:
        raise CubinError("CUBIN has no .symtab/.strtab: cannot name its kernels")
    out = []
    for at in range(0, len(symtab.data) - 23, 24):
        name, = struct.unpack_from("<I", symtab.data, at)
        end = strtab.data.find(b"\0", name)
        out.append(strtab.data[name:end if end >= 0 else len(strtab.data)].decode(errors="replace"))
    return out


def _attributes(data: bytes) -> list[tuple[int, bytes]]:
    """(attribute, payload) of every EIFMT_SVAL record in an `.nv.info` section."""
    out, at = [], 0
    while at + 4 <= len(data):
        fmt, attr, field = struct.unpack_from("<BBH", data, at)
        at += 4
        if fmt == EIFMT_SVAL:
            out.append((attr, data[at:at + field]))
            at += field
    return out


def cubin_resources(cubin: bytes) -> dict[str, KernelResources]:
    """{function: KernelResources} for every function (`.text.NAME` section) of a CUBIN that carries a
    register count (every `__global__` kernel does)."""
    sections = _sections(cubin)
    symbols = _symbols(sections)
    regs: dict[str, int] = {}
    frame: dict[str, int] = {}
    for sec in sections:
        if sec.name != ".nv.info":
            continue
        for attr, payload in _attributes(sec.data):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(payload) >= 8:
                sym, value = struct.unpack_from("<II", payload)
                if sym < len(symbols):
                    (regs if attr == EIATTR_REGCOUNT else frame)[symbols[sym]] = value
    shared = {s.name[len(".nv.shared."):]: s.size for s in sections if s.name.startswith(".nv.shared.")}
    kernels = [s.name[len(".text."):] for s in sections if s.name.startswith(".text.")]
    return {name: KernelResources(name, regs[name], frame.get(name, 0), shared.get(name, 0))
            for name in kernels if name in regs}


def text_section_registers(cubin: bytes) -> dict[str, int]:
    """The register count the ELF also keeps in each `.text.NAME` section header (sh_info >> 24):
    a second, independent encoding, used by the tests to check `cubin_resources`."""
    return {s.name[len(".text."):]: s.info >> 24 for s in _sections(cubin) if s.name.startswith(".text.")}
