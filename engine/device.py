"""Device model: a preset name or a .toml/.json file in, a validated frozen `Device` out.

Every number carries its provenance in `Device.source` ("datasheet", "estimate", "measured", "file").
`resident_blocks_per_sm` answers how many blocks of a given shape fit on one SM, and what limits them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import DeviceError

# "detected": read off this machine (the OS, the C compiler), not timed; "measured": timed on it.
SOURCES = ("datasheet", "estimate", "measured", "detected", "file")
KINDS = ("gpu", "cpu")
KiB = 1024
MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Device:
    """One GPU as the cost model sees it. Bandwidths in bytes/s, peaks in FLOP/s, times in seconds."""

    name: str
    sm_count: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    max_regs_per_thread: int
    smem_per_sm_bytes: int
    max_smem_per_block_bytes: int
    # Blocks asking for more than this need cudaFuncAttributeMaxDynamicSharedMemorySize at launch.
    default_smem_per_block_bytes: int
    # The driver keeps this much shared memory per block for itself (1 KiB from sm_80 on); it counts
    # against the SM's capacity in occupancy, which is why e.g. A100 has 164 KiB/SM but 163 KiB/block.
    reserved_smem_per_block_bytes: int
    l2_bytes: int
    # Device memory (DRAM/HBM): the default memory budget of a run on this device (engine/runtime/budget.py).
    memory_bytes: int
    clock_hz: float
    dram_bw_bytes_per_s: float
    l2_bw_bytes_per_s: float
    smem_bw_bytes_per_s: float
    peak_fp32_flops: float
    peak_fp16_tensor_flops: float
    launch_overhead_s: float
    grid_barrier_s: float
    compute_capability: tuple[int, int]
    nvrtc_arch: str
    # Excluded from the hash (dicts are unhashable) but compared, so equal devices hash equally.
    source: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    # "gpu", or "cpu" for the host (engine/host.py): an SM is a core running one block (an OpenMP
    # iteration) at a time, shared memory a block's stack arrays, a grid barrier an OpenMP barrier.
    kind: str = "gpu"
    vector_lanes: int = 1  # fp32 SIMD lanes of a core (cpu); a GPU's lanes are its threads
    # Widest global/shared access one thread issues (NVIDIA: 16 B, LDG.128/LDS.128): the vector width of
    # the GEMM's staging loads (engine/codegen/micro.py).
    vector_load_bytes: int = 16
    # FLOP/s of generated per-element code (loops outside GEMM / conv micro-tiles) as the host probe
    # measured it on math functions (erf, sigmoid, tanh: the flops OP_FLOPS weighs); 0 means
    # peak_fp32_flops (a GPU's per-element code runs at its FMA rate).
    elementwise_flops: float = 0.0
    # FLOP/s of the same code's plain arithmetic (add, sub, mul, max, ...: ops outside OP_FLOPS), measured
    # on a chain of them; several times the math rate on a CPU. 0 means elementwise_flops (one rate).
    plain_flops: float = 0.0
    description: str = ""  # what the device is (the host's CPU model)
    # Latency hiding (GPU): cycles a warp waits for a global load (L2 or DRAM) and the 128 B lines one warp
    # keeps in flight. By Little's law an SM streams at most warps x lines x 128 B per latency, so a grid of
    # one or two warps per SM cannot reach the SM's share of bandwidth (engine/schedule/cost.py). 0: off.
    mem_latency_cycles: float = 0.0
    lines_in_flight_per_warp: float = 4.0
    # Operand precisions the device's tensor cores take through mma.sync ("tf32", "fp16", "bf16"; empty:
    # none) and the dense TF32 peak (FLOP/s, FP32 accumulate) a contraction printed on the TF32 path is
    # charged at (engine/codegen/mma.py; engine/schedule/cost.py).
    tensor_precisions: tuple[str, ...] = ()
    peak_tf32_tensor_flops: float = 0.0

    def __post_init__(self) -> None:
        # Normalise the JSON/TOML spellings of compute_capability and tensor_precisions before validating.
        cc = self.compute_capability
        if isinstance(cc, list):
            object.__setattr__(self, "compute_capability", tuple(cc))
        if isinstance(self.tensor_precisions, list):
            object.__setattr__(self, "tensor_precisions", tuple(self.tensor_precisions))
        _validate(dataclasses.asdict(self) | {"compute_capability": self.compute_capability},
                  where=f"device {self.name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field (compute_capability as a list)."""
        out = dataclasses.asdict(self)
        out["compute_capability"] = list(self.compute_capability)
        out["tensor_precisions"] = list(self.tensor_precisions)
        return out

    def to_json(self) -> str:
        """JSON text that `Device.from_json` and `load_device_file` read back to an equal Device."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, where: str = "device dict") -> Device:
        """Build from a complete field dict; DeviceError names `where` and the offending key."""
        return _build(dict(values), where=where)

    @classmethod
    def from_json(cls, text: str) -> Device:
        """Inverse of `to_json`."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as err:
            raise DeviceError(f"device JSON is not valid JSON: {err}") from None
        if not isinstance(values, dict):
            raise DeviceError("device JSON must be an object of field names to values")
        return _build(values, where="device JSON")

    def source_of(self, field: str) -> str:
        """Where the value of `field` came from ("datasheet", "estimate", "measured", "file")."""
        return self.source.get(field, "unknown")

    def with_measured(self, **values: Any) -> Device:
        """Copy with `values` replaced and labelled "measured" (figures taken on an attached GPU)."""
        source = dict(self.source) | {key: "measured" for key in values}
        return _build(self.to_dict() | values | {"source": source}, where=f"device {self.name!r}")


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Device))
OPTIONAL_FIELDS: tuple[str, ...] = ("kind", "vector_lanes", "vector_load_bytes", "elementwise_flops", "plain_flops",
                                     "description",
                                     "mem_latency_cycles", "lines_in_flight_per_warp", "tensor_precisions",
                                     "peak_tf32_tensor_flops")  # default: a GPU
REQUIRED_FIELDS: tuple[str, ...] = tuple(f for f in FIELDS if f != "source" and f not in OPTIONAL_FIELDS)
_INT_FIELDS = {f.name for f in dataclasses.fields(Device) if f.type == "int" and f.name not in OPTIONAL_FIELDS}
_FLOAT_FIELDS = {f.name for f in dataclasses.fields(Device) if f.type == "float" and f.name not in OPTIONAL_FIELDS}
# Fields that may be zero (no driver reservation; a device file may model a free grid barrier).
_NONNEGATIVE_FIELDS = {"reserved_smem_per_block_bytes", "launch_overhead_s", "grid_barrier_s"}
_ARCH_RE = re.compile(r"^sm_\d{2,3}[af]?$")
GiB = 1024 * MiB
# Upper bounds no real GPU comes near (about 30x today's largest): a figure above one is a unit slip
# (bytes for KiB, Hz for kHz) or a hostile file, and would make the wavefront scheduler build billions
# of virtual execution units.
_CEILINGS: dict[str, float] = {
    "sm_count": 4096, "max_threads_per_block": 4096, "max_threads_per_sm": 65536, "max_blocks_per_sm": 1024,
    "regs_per_sm": 1 << 20, "smem_per_sm_bytes": 64 * MiB, "max_smem_per_block_bytes": 64 * MiB,
    "default_smem_per_block_bytes": 64 * MiB, "reserved_smem_per_block_bytes": 64 * MiB,
    "l2_bytes": 64 * GiB, "memory_bytes": 1 << 50, "clock_hz": 1e11, "dram_bw_bytes_per_s": 1e15,
    "l2_bw_bytes_per_s": 1e16, "smem_bw_bytes_per_s": 1e17, "peak_fp32_flops": 1e17,
    "peak_fp16_tensor_flops": 1e18, "launch_overhead_s": 1.0, "grid_barrier_s": 1.0,
}
_WARP_SIZES = (32, 64)
TENSOR_PRECISIONS = ("tf32", "fp16", "bf16")


def _type_name(value: Any) -> str:
    return type(value).__name__


def _validate(values: Mapping[str, Any], *, where: str) -> None:
    """Raise DeviceError on the first unknown key, missing key, wrong type or impossible value."""
    for key in values:
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            fix = f"did you mean {close[0]!r}?" if close else (f"required keys: {', '.join(REQUIRED_FIELDS)}; "
                                                   f"optional: {', '.join(OPTIONAL_FIELDS)}")
            raise DeviceError(f"{where}: unknown key {key!r} ({fix})")
    for key in REQUIRED_FIELDS:
        if key not in values:
            raise DeviceError(
                f"{where}: missing key {key!r} (give it, or set base = \"a100\" to inherit the rest from a preset)"
            )
    for key in REQUIRED_FIELDS:
        value = values[key]
        if key in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise DeviceError(f"{where}: key {key!r} must be an integer, got {_type_name(value)} {value!r}")
        elif key in _FLOAT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DeviceError(f"{where}: key {key!r} must be a number, got {_type_name(value)} {value!r}")
        if key in _INT_FIELDS | _FLOAT_FIELDS:
            if not value == value or value in (float("inf"), float("-inf")):
                raise DeviceError(f"{where}: key {key!r} must be a finite number, got {value!r}")
            if key in _NONNEGATIVE_FIELDS and value < 0:
                raise DeviceError(f"{where}: key {key!r} must be >= 0, got {value!r}")
            if key not in _NONNEGATIVE_FIELDS and value <= 0:
                raise DeviceError(f"{where}: key {key!r} must be > 0, got {value!r}")
            if key in _CEILINGS and value > _CEILINGS[key]:
                raise DeviceError(f"{where}: key {key!r} = {value!r} is beyond any real GPU (at most "
                                  f"{_CEILINGS[key]:g}); check the figure and its unit")
    _validate_kind(values, where)
    if values["warp_size"] not in _WARP_SIZES:
        raise DeviceError(f"{where}: key 'warp_size' must be 32 (NVIDIA) or 64, got {values['warp_size']!r}")
    if not isinstance(values["name"], str) or not values["name"]:
        raise DeviceError(f"{where}: key 'name' must be a non-empty string, got {values['name']!r}")
    cc = values["compute_capability"]
    if (
        not isinstance(cc, tuple | list)
        or len(cc) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc)
    ):
        raise DeviceError(f"{where}: key 'compute_capability' must be two integers like [8, 0], got {cc!r}")
    arch = values["nvrtc_arch"]
    if not isinstance(arch, str) or not _ARCH_RE.match(arch):
        raise DeviceError(f"{where}: key 'nvrtc_arch' must look like \"sm_80\", got {arch!r}")
    source = values.get("source", {})
    if not isinstance(source, Mapping):
        raise DeviceError(f"{where}: key 'source' must be a table of field = provenance, got {source!r}")
    for key, label in source.items():
        if key not in REQUIRED_FIELDS + OPTIONAL_FIELDS:
            raise DeviceError(f"{where}: key 'source.{key}' names no device field (known keys: {', '.join(REQUIRED_FIELDS + OPTIONAL_FIELDS)})")
        if label not in SOURCES:
            raise DeviceError(f"{where}: key 'source.{key}' must be one of {', '.join(SOURCES)}, got {label!r}")
    _check_limits(values, where)


def _validate_kind(values: Mapping[str, Any], where: str) -> None:
    kind = values.get("kind", "gpu")
    if kind not in KINDS:
        raise DeviceError(f"{where}: key 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    lanes = values.get("vector_lanes", 1)
    if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 64:
        raise DeviceError(f"{where}: key 'vector_lanes' must be an integer from 1 to 64, got {lanes!r}")
    vb = values.get("vector_load_bytes", 16)
    if isinstance(vb, bool) or not isinstance(vb, int) or vb not in (4, 8, 16, 32, 64):
        raise DeviceError(f"{where}: key 'vector_load_bytes' must be 4, 8, 16, 32 or 64, got {vb!r}")
    for key in ("elementwise_flops", "plain_flops"):
        rate = values.get(key, 0.0)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= _CEILINGS["peak_fp32_flops"]:
            raise DeviceError(f"{where}: key {key!r} must be a number from 0 to "
                              f"{_CEILINGS['peak_fp32_flops']:g}, got {rate!r}")
    for key, top in (("mem_latency_cycles", 10000), ("lines_in_flight_per_warp", 64)):
        value = values.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top:
            raise DeviceError(f"{where}: key {key!r} must be a number from 0 to {top}, got {value!r}")
    if values.get("mem_latency_cycles", 0.0) and not values.get("lines_in_flight_per_warp", 4.0):
        raise DeviceError(f"{where}: key 'lines_in_flight_per_warp' must be > 0 when mem_latency_cycles is set")
    precisions = values.get("tensor_precisions", ())
    if not isinstance(precisions, tuple | list) or not all(p in TENSOR_PRECISIONS for p in precisions):
        raise DeviceError(f"{where}: key 'tensor_precisions' must be a list of {', '.join(TENSOR_PRECISIONS)}, "
                          f"got {precisions!r}")
    tf32 = values.get("peak_tf32_tensor_flops", 0.0)
    if isinstance(tf32, bool) or not isinstance(tf32, int | float) or not 0 <= tf32 <= _CEILINGS["peak_fp16_tensor_flops"]:
        raise DeviceError(f"{where}: key 'peak_tf32_tensor_flops' must be a number from 0 to "
                          f"{_CEILINGS['peak_fp16_tensor_flops']:g}, got {tf32!r}")
    if "tf32" in precisions and not tf32:
        raise DeviceError(f"{where}: key 'peak_tf32_tensor_flops' must be > 0 when tensor_precisions has tf32")
    text = values.get("description", "")
    if not isinstance(text, str) or len(text) > 200:
        raise DeviceError(f"{where}: key 'description' must be a string of at most 200 characters")


def _check_limits(v: Mapping[str, Any], where: str) -> None:
    """Cross-field rules: each is a limit that real hardware cannot violate."""
    rules = [
        (v["max_threads_per_block"] % v["warp_size"] == 0, "max_threads_per_block",
         f"must be a multiple of warp_size ({v['warp_size']})"),
        (v["max_threads_per_block"] <= v["max_threads_per_sm"], "max_threads_per_block",
         f"must be <= max_threads_per_sm ({v['max_threads_per_sm']})"),
        (v["max_threads_per_sm"] % v["warp_size"] == 0, "max_threads_per_sm",
         f"must be a multiple of warp_size ({v['warp_size']})"),
        (v["max_regs_per_thread"] <= 255, "max_regs_per_thread", "must be <= 255 (the ISA limit)"),
        (v["max_regs_per_thread"] * v["warp_size"] <= v["regs_per_sm"], "max_regs_per_thread",
         f"must leave room for one warp in regs_per_sm ({v['regs_per_sm']})"),
        (v["max_smem_per_block_bytes"] + v["reserved_smem_per_block_bytes"] <= v["smem_per_sm_bytes"],
         "max_smem_per_block_bytes",
         f"must be <= smem_per_sm_bytes - reserved_smem_per_block_bytes "
         f"({v['smem_per_sm_bytes'] - v['reserved_smem_per_block_bytes']})"),
        (v["default_smem_per_block_bytes"] <= v["max_smem_per_block_bytes"], "default_smem_per_block_bytes",
         f"must be <= max_smem_per_block_bytes ({v['max_smem_per_block_bytes']})"),
    ]
    for ok, key, rule in rules:
        if not ok:
            raise DeviceError(f"{where}: key {key!r} = {v[key]!r} {rule}")


def _build(values: dict[str, Any], *, where: str) -> Device:
    """Validate with `where` in the messages, then construct (which validates again, cheaply)."""
    cc = values.get("compute_capability")
    if isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc):
        values["compute_capability"] = tuple(int(p) for p in cc.split("."))
    elif isinstance(cc, list):
        values["compute_capability"] = tuple(cc)
    if isinstance(values.get("tensor_precisions"), list):
        values["tensor_precisions"] = tuple(values["tensor_precisions"])
    for key in (*_FLOAT_FIELDS, "elementwise_flops", "plain_flops", "mem_latency_cycles", "lines_in_flight_per_warp",
                "peak_tf32_tensor_flops"):
        # TOML/JSON write 5e-6 and 900000000000 alike; store floats so round trips compare equal.
        if isinstance(values.get(key), int) and not isinstance(values.get(key), bool):
            values[key] = float(values[key])
    _validate(values, where=where)
    values["source"] = dict(values.get("source", {}))
    return Device(**values)


# ---------------------------------------------------------------------------------------------------
# Presets. Datasheet figures from shared/devices.md (NVIDIA whitepapers); derived figures are estimates:
#   smem_bw  = 32 banks x 4 B/clk per SM x SMs x boost clock (theoretical peak).
#   l2_bw    = whitepaper L2 read bytes/clk x boost clock (V100 2048 B/clk, A100 5120 B/clk; GA102 and
#              Hopper assumed like their predecessor). Theoretical; microbenchmarks reach ~70% of it.
#   launch   = 5 us per kernel: our launch path has no framework dispatch. AStitch reports ~10 us of
#              CPU-GPU interaction per kernel in framework execution; use that to model a framework.
#   barrier  = AStitch measured at most 2.72 us for a grid barrier on V100 with 160 resident blocks.
#              Arrivals serialise on one L2 atomic, so scale linearly with SMs (blocks resident) and
#              inversely with clock: 2.72 us x (SMs / 80) x (1530 MHz / clock).
# ---------------------------------------------------------------------------------------------------

_ESTIMATED = ("l2_bw_bytes_per_s", "smem_bw_bytes_per_s", "launch_overhead_s", "grid_barrier_s",
              "mem_latency_cycles", "lines_in_flight_per_warp")
# Latency hiding, one pair for every preset: a global load's latency (published microbenchmarks put an L2
# miss at ~500-600 cycles on Volta..Hopper) and 4 lines in flight per warp (our loops unroll loads about
# that far). Their ratio is what matters; the kernels measured on an H200 (benchmarks/gpu_analysis.py)
# fit ratios of 75-300 about equally (per-kernel median factor 1.6-1.8 against 2.3 without the term).
_MEM_LATENCY_CYCLES = 600.0
_LINES_IN_FLIGHT = 4.0
_V100_BARRIER_S = 2.72e-6
_LAUNCH_OVERHEAD_S = 5e-6


def _preset(name: str, *, sm: int, clock_mhz: float, fp32_tflops: float, fp16_tflops: float,
            dram_gbs: float, l2_mib: int, memory_bytes: int, smem_sm_kib: int, smem_block_kib: int, threads_sm: int,
            blocks_sm: int, cc: tuple[int, int], arch: str, l2_bytes_per_clk: int,
            measured: tuple[str, ...] = (), tensor: tuple[str, ...] = (), tf32_tflops: float = 0.0) -> Device:
    clock = clock_mhz * 1e6
    values: dict[str, Any] = dict(
        name=name, sm_count=sm, warp_size=32, max_threads_per_block=1024, max_threads_per_sm=threads_sm,
        max_blocks_per_sm=blocks_sm, regs_per_sm=65536, max_regs_per_thread=255,
        smem_per_sm_bytes=smem_sm_kib * KiB, max_smem_per_block_bytes=smem_block_kib * KiB,
        default_smem_per_block_bytes=48 * KiB,
        reserved_smem_per_block_bytes=(smem_sm_kib - smem_block_kib) * KiB,
        l2_bytes=l2_mib * MiB, memory_bytes=memory_bytes, clock_hz=clock, dram_bw_bytes_per_s=dram_gbs * 1e9,
        l2_bw_bytes_per_s=float(l2_bytes_per_clk * clock), smem_bw_bytes_per_s=32 * 4 * sm * clock,
        peak_fp32_flops=fp32_tflops * 1e12, peak_fp16_tensor_flops=fp16_tflops * 1e12,
        launch_overhead_s=_LAUNCH_OVERHEAD_S,
        grid_barrier_s=_V100_BARRIER_S * (sm / 80) * (1530e6 / clock),
        compute_capability=cc, nvrtc_arch=arch,
        mem_latency_cycles=_MEM_LATENCY_CYCLES, lines_in_flight_per_warp=_LINES_IN_FLIGHT,
        tensor_precisions=tensor, peak_tf32_tensor_flops=tf32_tflops * 1e12,
    )
    values["source"] = {
        key: "measured" if key in measured else "estimate" if key in _ESTIMATED else "datasheet"
        for key in (*REQUIRED_FIELDS, "mem_latency_cycles", "lines_in_flight_per_warp", "tensor_precisions",
                    "peak_tf32_tensor_flops")
        if key not in ("name", "nvrtc_arch")
    }
    return Device(**values)


# Tensor cores: Volta takes fp16 only (mma.m8n8k4); Ampere and Hopper take tf32, fp16 and bf16. TF32 peaks are
# the datasheets' dense figures (A100 156, RTX 3090 35.6 (GA102 whitepaper), H100/H200 SXM 494.7 TFLOPS; the
# sheets' larger numbers are with 2:4 sparsity, which our kernels never use).
PRESETS: dict[str, Device] = {
    # CUDA 13 NVRTC has no sm_70 target: V100 is for modeling; its kernels compile for sm_75.
    "v100": _preset("v100", sm=80, clock_mhz=1530, fp32_tflops=15.7, fp16_tflops=125, dram_gbs=900,
                    l2_mib=6, memory_bytes=16 * GiB, smem_sm_kib=96, smem_block_kib=96, threads_sm=2048, blocks_sm=32,
                    cc=(7, 0), arch="sm_75", l2_bytes_per_clk=2048, tensor=("fp16",)),
    "a100": _preset("a100", sm=108, clock_mhz=1410, fp32_tflops=19.5, fp16_tflops=312, dram_gbs=1555,
                    l2_mib=40, memory_bytes=40 * GiB, smem_sm_kib=164, smem_block_kib=163, threads_sm=2048, blocks_sm=32,
                    cc=(8, 0), arch="sm_80", l2_bytes_per_clk=5120,
                    tensor=("tf32", "fp16", "bf16"), tf32_tflops=156),
    # FP16 tensor peak with FP32 accumulate (35.6); 71 needs FP16 accumulate, which our kernels never use.
    "rtx3090": _preset("rtx3090", sm=82, clock_mhz=1695, fp32_tflops=35.6, fp16_tflops=35.6, dram_gbs=936,
                       l2_mib=6, memory_bytes=24 * GiB, smem_sm_kib=100, smem_block_kib=99, threads_sm=1536, blocks_sm=16,
                       cc=(8, 6), arch="sm_86", l2_bytes_per_clk=2048,
                       tensor=("tf32", "fp16", "bf16"), tf32_tflops=35.6),
    "h100": _preset("h100", sm=132, clock_mhz=1980, fp32_tflops=67, fp16_tflops=989, dram_gbs=3350,
                    l2_mib=50, memory_bytes=80 * GiB, smem_sm_kib=228, smem_block_kib=227, threads_sm=2048, blocks_sm=32,
                    cc=(9, 0), arch="sm_90", l2_bytes_per_clk=5120,
                    tensor=("tf32", "fp16", "bf16"), tf32_tflops=494.7),
    # The datasheet gives 50-60 MB of L2; PyTorch reported 60 MB on a real H200, so that one is measured.
    "h200": _preset("h200", sm=132, clock_mhz=1980, fp32_tflops=67, fp16_tflops=989, dram_gbs=4800,
                    l2_mib=60, memory_bytes=141 * 10**9, smem_sm_kib=228, smem_block_kib=227, threads_sm=2048, blocks_sm=32,
                    cc=(9, 0), arch="sm_90", l2_bytes_per_clk=5120, measured=("l2_bytes",),
                    tensor=("tf32", "fp16", "bf16"), tf32_tflops=494.7),
}


# Marketing names as the driver reports them (cuDeviceGetName) -> the preset planned for by default.
_GPU_NAMES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("RTX 3090", "rtx3090"), ("V100", "v100"))


def preset_for_gpu(gpu_name: str, default: str = "a100") -> str:
    """The preset matching a GPU's driver name ("NVIDIA H100 80GB HBM3" -> "h100"), else `default`: what
    the CUDA backend plans for when no --device is given."""
    upper = gpu_name.upper()
    return next((preset for key, preset in _GPU_NAMES if key in upper), default)


def named_device(name: str, default: str) -> str:
    """`name` when it names a device without opening a file (a preset or host), else `default`: what a
    saved plan's `device` field is run for (a device file it was made with may not be here)."""
    return name if name in PRESETS or name == "host" else default


def get_device(name_or_path: str | Path | Device) -> Device:
    """A preset by name (case-insensitive) or a device file (.toml/.json) by path; a Device as it is."""
    if isinstance(name_or_path, Device):
        return name_or_path
    text = str(name_or_path)
    preset = PRESETS.get(text.strip().lower())
    if preset is not None:
        return preset
    if text.strip().lower() == "host":
        from engine.host import host_device

        return host_device()
    if Path(text).suffix.lower() in (".toml", ".json") or Path(text).exists():
        return load_device_file(text)
    raise DeviceError(
        f"unknown device {text!r}: use a preset ({', '.join(PRESETS)}), host (this CPU, measured) or a path "
        "to a .toml/.json device file"
    )


def load_device_file(path: str | Path) -> Device:
    """Read a device file: `base = "a100"` plus overrides, or every field. Given fields are "file"."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DeviceError(f"{path}: cannot read device file ({err.strerror}); check the path") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            values = tomllib.loads(raw.decode("utf-8"))
        elif suffix == ".json":
            values = json.loads(raw)
        else:
            raise DeviceError(f"{path}: device files must end in .toml or .json")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise DeviceError(f"{path}: not valid TOML: {err}; fix the syntax") from None
    except json.JSONDecodeError as err:
        raise DeviceError(f"{path}: not valid JSON: {err}; fix the syntax") from None
    except RecursionError:
        raise DeviceError(f"{path}: not a device file (JSON nested too deeply)") from None
    if not isinstance(values, dict):
        raise DeviceError(f"{path}: a device file must be a table/object of field = value")

    base_name = values.pop("base", None)
    given_source = values.pop("source", {})
    if not isinstance(given_source, dict):
        raise DeviceError(f"{path}: key 'source' must be a table of field = provenance, got {given_source!r}")
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    if base_name is not None:
        base = PRESETS.get(str(base_name).lower()) if isinstance(base_name, str) else None
        if base is None:
            raise DeviceError(f"{path}: key 'base' = {base_name!r} is not a preset (use one of {', '.join(PRESETS)})")
        merged = base.to_dict()
        source = dict(base.source)
        del merged["name"]  # a derived device is named after its file unless it says otherwise
    merged.update(values)
    merged.setdefault("name", path.stem)
    source.update({key: "file" for key in values if key in REQUIRED_FIELDS and key not in ("name", "nvrtc_arch")})
    source.update(given_source)
    merged["source"] = source
    return _build(merged, where=str(path))


# ---------------------------------------------------------------------------------------------------
# Occupancy, following cuda_occupancy.h for compute capability 7.x-9.x with the maximum smem carveout.
# ---------------------------------------------------------------------------------------------------

_REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256
_SUB_PARTITIONS = 4  # the register file is split over 4 schedulers; a warp lives in one of them


def _smem_alloc_unit(device: Device) -> int:
    return 256 if device.compute_capability[0] < 8 else 128


def resident_blocks_per_sm(
    device: Device, threads_per_block: int, regs_per_thread: int, smem_bytes: int
) -> tuple[int, str]:
    """Blocks of this shape resident on one SM, and the limiter.

    The limiter is "threads", "registers", "shared_memory" or "blocks_per_sm" (first in that order on a
    tie). When the block cannot run at all the count is 0 and the limiter reads "<resource>: <why>".
    `regs_per_thread` 0 means "not known yet" and does not limit.
    """
    if threads_per_block <= 0:
        return 0, f"threads: a block needs at least one thread, got {threads_per_block}"
    if threads_per_block > device.max_threads_per_block:
        return 0, (f"threads: {threads_per_block} threads per block exceeds the limit of "
                   f"{device.max_threads_per_block}")
    if regs_per_thread < 0 or smem_bytes < 0:
        return 0, f"registers: negative request ({regs_per_thread} registers, {smem_bytes} B shared memory)"
    if regs_per_thread > device.max_regs_per_thread:
        return 0, f"registers: {regs_per_thread} per thread exceeds the limit of {device.max_regs_per_thread}"
    if smem_bytes > device.max_smem_per_block_bytes:
        return 0, (f"shared_memory: {smem_bytes} B per block exceeds the limit of "
                   f"{device.max_smem_per_block_bytes} B")

    warps = -(-threads_per_block // device.warp_size)
    limits: dict[str, int] = {"threads": (device.max_threads_per_sm // device.warp_size) // warps}

    regs_per_warp = -(-regs_per_thread * device.warp_size // _REG_ALLOC_UNIT) * _REG_ALLOC_UNIT
    if regs_per_warp:
        # The hardware checks a block's registers as if its warps were spread evenly over all four
        # sub-partitions, so round the warp count up to a multiple of 4 for the fit test.
        assumed = regs_per_warp * (-(-warps // _SUB_PARTITIONS) * _SUB_PARTITIONS)
        if assumed > device.regs_per_sm:
            return 0, (f"registers: {threads_per_block} threads x {regs_per_thread} registers need "
                       f"{assumed} (allocated per warp in units of 256) > {device.regs_per_sm} per SM")
        warps_per_partition = (device.regs_per_sm // _SUB_PARTITIONS) // regs_per_warp
        limits["registers"] = warps_per_partition * _SUB_PARTITIONS // warps

    unit = _smem_alloc_unit(device)
    smem_alloc = -(-(smem_bytes + device.reserved_smem_per_block_bytes) // unit) * unit
    if smem_alloc:
        limits["shared_memory"] = device.smem_per_sm_bytes // smem_alloc
    limits["blocks_per_sm"] = device.max_blocks_per_sm

    blocks = min(limits.values())
    limiter = next(name for name, value in limits.items() if value == blocks)
    return blocks, limiter


def wave_grid(device: Device, blocks: int, threads: int, regs_per_thread: int, smem_bytes: int) -> tuple[int, str]:
    """Grid of a kernel whose blocks must all be resident at once (a grid barrier, a persistent kernel):
    min(blocks, resident blocks per SM x SMs), and how that was decided. (0, why) when no block fits.
    Modeled from the device's figures; with a GPU attached the launcher asks the driver instead."""
    per_sm, why = resident_blocks_per_sm(device, threads, regs_per_thread, smem_bytes)
    if per_sm == 0:
        return 0, why
    regs = f"{regs_per_thread} registers" if regs_per_thread else "registers not yet compiled"
    wave = per_sm * device.sm_count
    return min(blocks, wave), (f"one wave of {wave} = {per_sm}/SM (limited by {why}) x {device.sm_count} SMs "
                               f"at {regs}, modeled for {device.name}")
