"""cuda-sim: the printed CUDA source run on the CPU with SIMT semantics (threads as coroutines, barriers,
shuffles and grid syncs as rendezvous), checked for deadlocks, partial barriers, out-of-range and
never-written accesses and races, with the bytes each kernel moved counted. See docs/simt.md."""

from engine.runtime.simt.driver import DEFAULT_GRID_CAP, run_simt
from engine.runtime.simt.report import KINDS, Finding, KernelTraffic, SimReport

__all__ = ["DEFAULT_GRID_CAP", "KINDS", "Finding", "KernelTraffic", "SimReport", "run_simt"]
