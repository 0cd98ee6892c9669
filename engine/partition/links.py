"""Device-to-device links: a preset name (nvlink, pcie, ethernet) or a .json file in, a validated
frozen `Link` out. Like device presets, every figure says where it came from."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from engine.errors import DeviceError

# Sources, one direction of one link (a transfer from device a to device b uses a's link to b):
#   nvlink   NVLink 3 on A100 SXM: 12 links x 25 GB/s per direction = 300 GB/s (NVIDIA A100 datasheet
#            "600 GB/s" is both directions). Latency 2 us: estimate (small-message GPU-to-GPU copies).
#   pcie     PCIe 4.0 x16: 16 GT/s x 16 lanes x 128b/130b = 31.5 GB/s per direction (PCI-SIG 4.0 spec).
#            Latency 5 us: estimate (a cudaMemcpyPeer of a few bytes through the root complex).
#   ethernet 100 Gigabit Ethernet line rate (IEEE 802.3ba): 12.5 GB/s. Latency 10 us: estimate (one
#            RDMA/RoCE round of a small message; TCP through a software stack takes longer).


@dataclasses.dataclass(frozen=True)
class Link:
    """One direction of a point-to-point link; every ordered device pair gets its own."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    description: str = ""

    def transfer_us(self, nbytes: int) -> float:
        """Modeled time of one transfer of `nbytes`: latency + bytes / bandwidth."""
        return (self.latency_s + nbytes / self.bandwidth_bytes_per_s) * 1e6

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


LINKS: dict[str, Link] = {
    "nvlink": Link("nvlink", 300e9, 2e-6, {"bandwidth_bytes_per_s": "datasheet", "latency_s": "estimate"},
                   "NVLink 3 (A100 SXM), one direction"),
    "pcie": Link("pcie", 31.5e9, 5e-6, {"bandwidth_bytes_per_s": "datasheet", "latency_s": "estimate"},
                 "PCIe 4.0 x16, one direction"),
    "ethernet": Link("ethernet", 12.5e9, 10e-6, {"bandwidth_bytes_per_s": "datasheet", "latency_s": "estimate"},
                     "100 Gigabit Ethernet, one direction"),
}
DEFAULT_LINK = "pcie"
_KEYS = ("name", "bandwidth_bytes_per_s", "latency_s", "source", "description")
_FIX = 'write {"bandwidth_bytes_per_s": 25e9, "latency_s": 5e-6} (name optional)'


def get_link(name_or_path: str | Link) -> Link:
    """A preset by name (case-insensitive) or a link .json file; DeviceError names what is wrong."""
    if isinstance(name_or_path, Link):
        return name_or_path
    text = str(name_or_path).strip()
    if text.lower() in LINKS:
        return LINKS[text.lower()]
    if not text.lower().endswith(".json"):
        raise DeviceError(f"unknown link {text!r}", hint=f"use {', '.join(LINKS)} or a .json link file")
    return load_link_file(text)


def load_link_file(path: str | Path) -> Link:
    path = Path(path)
    try:
        values = json.loads(path.read_text())
    except OSError as err:
        raise DeviceError(f"{path}: cannot read link file ({err.strerror})", hint="check the path") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise DeviceError(f"{path}: not a valid JSON link file", hint=_FIX) from None
    if not isinstance(values, dict):
        raise DeviceError(f"{path}: a link file must be a JSON object", hint=_FIX)
    unknown = sorted(set(values) - set(_KEYS))
    if unknown:
        raise DeviceError(f"{path}: unknown key {unknown[0]!r} in link file", hint=f"known keys: {', '.join(_KEYS)}")
    for key in ("bandwidth_bytes_per_s", "latency_s"):
        v = values.get(key)
        if v is None:
            raise DeviceError(f"{path}: link file lacks {key!r}", hint=_FIX)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf") \
                or (key == "bandwidth_bytes_per_s" and v <= 0):
            raise DeviceError(f"{path}: key {key!r} must be a finite number {'> 0' if 'band' in key else '>= 0'}, "
                              f"got {v!r}")
    name = values.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise DeviceError(f"{path}: key 'name' must be a non-empty string")
    return Link(name, float(values["bandwidth_bytes_per_s"]), float(values["latency_s"]),
                {"bandwidth_bytes_per_s": "file", "latency_s": "file"}, str(values.get("description", "")))
