"""Profile: per-kernel times of one program run (measured or modeled), with where they came from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelTime:
    kernel: str
    us: float  # median over `runs` launches
    runs: int


@dataclass(frozen=True)
class Profile:
    label: str  # e.g. "measured on CPU (C backend)"
    backend: str
    kernels: tuple[KernelTime, ...]
    # the whole launch list run back to back (median of as many runs), where measured (the CUDA backend,
    # run_cuda(program_time=True)): launch overheads overlap there, while each kernel's own time pays its launch
    program_us: float | None = None

    @property
    def total_us(self) -> float:
        return sum(k.us for k in self.kernels)

    def us(self, kernel: str) -> float:
        for k in self.kernels:
            if k.kernel == kernel:
                return k.us
        raise KeyError(kernel)

    def to_json(self) -> dict:
        return {"label": self.label, "backend": self.backend, "total_us": self.total_us,
                "kernels": [{"kernel": k.kernel, "us": k.us, "runs": k.runs} for k in self.kernels]} \
            | ({"program_us": self.program_us} if self.program_us is not None else {})
