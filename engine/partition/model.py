"""The Partition value: which device runs each kernel, the transfer plan between devices, per-device
memory peaks, and the modeled timeline (kernels per device, transfers per link) with its JSON form."""

from __future__ import annotations

from dataclasses import dataclass

from engine.partition.links import Link


@dataclass(frozen=True)
class KernelSlot:
    """Kernel `kernel` on device `device` from `start_us` to `end_us` of one request (modeled)."""

    kernel: str
    device: int
    start_us: float
    end_us: float
    weight_bytes: int
    tensor_parallel: bool = False  # a column slice of a split contraction


@dataclass(frozen=True)
class Transfer:
    """`tensor` ({bytes} B) sent from device `src` to `dst` over their link: latency + bytes/bandwidth."""

    tensor: str
    src: int
    dst: int
    bytes: int
    us: float
    start_us: float = 0.0
    end_us: float = 0.0


@dataclass(frozen=True)
class DeviceStage:
    """What one device holds: its kernels (launch order), resident weights and the planned peak."""

    device: int
    kernels: tuple[str, ...]
    weight_bytes: int
    peak_bytes: int  # weights + the peak of its activations (received, produced, sent) by liveness
    busy_us: float


@dataclass(frozen=True)
class Partition:
    model_name: str
    policy: str
    device: str  # the device every one of the `devices` is (its preset or file name)
    devices: int
    link: Link
    budget_bytes: int  # each device's memory_bytes
    stages: tuple[DeviceStage, ...]
    transfers: tuple[Transfer, ...]
    kernels: tuple[KernelSlot, ...]  # launch order
    makespan_us: float  # one request through the partition (event simulation)
    period_us: float  # a stream of requests: the busiest device or link per request
    single_device_us: float  # the unsplit plan on one device (sum of its kernels)
    single_device_peak_bytes: int
    tensor_parallel: tuple[str, ...] = ()  # the contractions split across all devices
    decisions: tuple[str, ...] = ()

    @property
    def transfer_bytes(self) -> int:
        return sum(t.bytes for t in self.transfers)

    @property
    def single_device_fits(self) -> bool:
        return self.single_device_peak_bytes <= self.budget_bytes

    def device_of(self, kernel: str) -> int:
        return next(k.device for k in self.kernels if k.kernel == kernel)

    def to_json(self) -> dict:
        """What `tileweave partition --json` prints (the issue's schema plus the link, budget and timeline)."""
        return {
            "model": self.model_name, "policy": self.policy, "device": self.device, "devices": self.devices,
            "link": self.link.to_dict(), "budget_bytes": self.budget_bytes,
            "stages": [{"device": s.device, "kernels": list(s.kernels), "peak_bytes": s.peak_bytes,
                        "weight_bytes": s.weight_bytes, "busy_us": round(s.busy_us, 3)} for s in self.stages],
            "transfers": [{"tensor": t.tensor, "src": t.src, "dst": t.dst, "bytes": t.bytes, "us": round(t.us, 3),
                           "start_us": round(t.start_us, 3), "end_us": round(t.end_us, 3)} for t in self.transfers],
            "kernels": [{"kernel": k.kernel, "device": k.device, "start_us": round(k.start_us, 3),
                         "end_us": round(k.end_us, 3), "tensor_parallel": k.tensor_parallel} for k in self.kernels],
            "makespan_us": round(self.makespan_us, 3), "period_us": round(self.period_us, 3),
            "single_device_us": round(self.single_device_us, 3),
            "single_device_peak_bytes": self.single_device_peak_bytes,
            "single_device_fits": self.single_device_fits,
            "transfer_bytes": self.transfer_bytes, "tensor_parallel": list(self.tensor_parallel),
            "decisions": list(self.decisions),
        }
