"""What a cuda-sim run found: findings (kind, kernel, printed line, thread, message) and the bytes each kernel
moved beside the plan's modeled traffic; one line per finding kind for the CLI, everything as JSON."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

# Finding kinds, in the order the CLI lists them.
KINDS = ("deadlock", "partial_barrier", "partial_shuffle", "out_of_range", "uninitialized_read", "race", "misaligned")


@dataclass(frozen=True)
class Finding:
    kind: str  # one of KINDS
    kernel: str
    file: str  # the printed CUDA unit (KERNEL.cu, as `tileweave compile --target cuda` writes it)
    line: int  # line in `file`; 0 when the finding has no single line
    source: str  # that line's text
    block: tuple[int, int, int]  # blockIdx of the first occurrence
    thread: tuple[int, int, int]  # threadIdx of the first occurrence
    buffer: str  # the tensor or shared-memory buffer, "" for synchronisation findings
    message: str
    count: int = 1  # occurrences at this line and buffer
    launch: int = -1  # index in the program's launch list

    def describe(self) -> str:
        where = f"{self.kernel} {self.file}:{self.line}" if self.line else self.kernel
        more = f" (x{self.count})" if self.count > 1 else ""
        return f"{where}: {self.message}{more}"


@dataclass(frozen=True)
class KernelTraffic:
    """Bytes a kernel's threads actually loaded/stored (all its launches), and the plan's modeled traffic
    per level (GroupCost.traffic_bytes: bytes each level receives from the one below) when known."""

    kernel: str
    launches: int
    global_load_bytes: int
    global_store_bytes: int
    shared_load_bytes: int
    shared_store_bytes: int
    modeled: dict = field(default_factory=dict)

    @property
    def global_bytes(self) -> int:
        return self.global_load_bytes + self.global_store_bytes


@dataclass(frozen=True)
class SimReport:
    findings: tuple[Finding, ...]
    kernels: tuple[KernelTraffic, ...]
    launches: int  # launches run
    stopped: str = ""  # a launch that could not finish and why; later launches did not run

    @property
    def ok(self) -> bool:
        return not self.findings

    def kinds(self) -> Counter:
        """Findings per kind (distinct lines and buffers, not occurrences)."""
        return Counter(f.kind for f in self.findings)

    def summary_lines(self) -> list[str]:
        """One line per finding kind: how many, and the first one."""
        out = []
        for kind in KINDS:
            found = [f for f in self.findings if f.kind == kind]
            if found:
                out.append(f"cuda-sim {kind}: {len(found)} finding(s); first: {found[0].describe()}")
        return out

    def traffic_lines(self) -> list[str]:
        out = []
        for k in self.kernels:
            modeled = ", ".join(f"{lvl} {int(b)} B" for lvl, b in k.modeled.items())
            out.append(f"{k.kernel}: global {k.global_load_bytes} B loaded, {k.global_store_bytes} B stored; "
                       f"shared {k.shared_load_bytes + k.shared_store_bytes} B"
                       + (f" (modeled: {modeled})" if modeled else ""))
        return out

    def to_json(self) -> dict:
        return {"ok": self.ok, "launches": self.launches, "stopped": self.stopped,
                "findings": [asdict(f) for f in self.findings], "kernels": [asdict(k) for k in self.kernels]}
