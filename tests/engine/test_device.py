"""Tests for engine/device.py: presets, device files, JSON round trip, occupancy."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.device import (
    FIELDS,
    PRESETS,
    REQUIRED_FIELDS,
    SOURCES,
    Device,
    KiB,
    get_device,
    load_device_file,
    resident_blocks_per_sm,
)
from engine.errors import DeviceError

A100 = PRESETS["a100"]
V100 = PRESETS["v100"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_validates_and_labels_every_number(name: str) -> None:
    device = PRESETS[name]
    assert device.name == name
    assert Device.from_dict(device.to_dict()) == device
    for field in REQUIRED_FIELDS:
        if field in ("name", "nvrtc_arch"):
            continue
        assert device.source_of(field) in SOURCES, field
    for field in ("l2_bw_bytes_per_s", "smem_bw_bytes_per_s", "launch_overhead_s", "grid_barrier_s"):
        assert device.source_of(field) == "estimate"
    assert device.source_of("sm_count") == "datasheet"
    assert device.max_smem_per_block_bytes + device.reserved_smem_per_block_bytes == device.smem_per_sm_bytes


def test_preset_figures_match_devices_md() -> None:
    assert (A100.sm_count, A100.smem_per_sm_bytes, A100.max_smem_per_block_bytes) == (108, 164 * KiB, 163 * KiB)
    assert A100.dram_bw_bytes_per_s == 1555e9 and A100.compute_capability == (8, 0)
    assert PRESETS["rtx3090"].max_threads_per_sm == 1536 and PRESETS["rtx3090"].max_blocks_per_sm == 16
    assert PRESETS["h200"].dram_bw_bytes_per_s == 4800e9
    # CUDA 13 has no sm_70 target; V100 kernels compile for sm_75.
    assert V100.compute_capability == (7, 0) and V100.nvrtc_arch == "sm_75"
    # AStitch's barrier figure is the V100 anchor of the per-device scaling.
    assert V100.grid_barrier_s == pytest.approx(2.72e-6)
    assert A100.grid_barrier_s > V100.grid_barrier_s


def test_get_device_is_case_insensitive_and_lists_presets_when_unknown() -> None:
    assert get_device("A100") is A100
    assert get_device(A100) is A100  # the API's device arguments take a Device as well as a name
    with pytest.raises(DeviceError) as info:
        get_device("a1000")
    message = str(info.value)
    assert "a1000" in message and all(p in message for p in PRESETS) and ".toml" in message
    assert "\n" not in message


def test_json_round_trip_and_hash() -> None:
    for device in PRESETS.values():
        again = Device.from_json(device.to_json())
        assert again == device and hash(again) == hash(device)
        assert again.source == device.source
    assert len({hash(d) for d in PRESETS.values()}) == len(PRESETS)


def test_with_measured_relabels_only_the_measured_fields() -> None:
    measured = PRESETS["h100"].with_measured(dram_bw_bytes_per_s=3.0e12)
    assert measured.dram_bw_bytes_per_s == 3.0e12
    assert measured.source_of("dram_bw_bytes_per_s") == "measured"
    assert measured.source_of("sm_count") == "datasheet"
    assert PRESETS["h100"].source_of("dram_bw_bytes_per_s") == "datasheet"


# --- device files -----------------------------------------------------------------------------------


def test_toml_file_with_base_and_overrides(tmp_path) -> None:
    path = tmp_path / "my_a100.toml"
    path.write_text('base = "A100"\nsm_count = 54\ndram_bw_bytes_per_s = 800e9\n')
    device = get_device(str(path))
    assert device.name == "my_a100"
    assert device.sm_count == 54 and device.dram_bw_bytes_per_s == 800e9
    assert device.l2_bytes == A100.l2_bytes
    assert device.source_of("sm_count") == "file" and device.source_of("l2_bytes") == "datasheet"


def test_json_file_with_every_field_round_trips(tmp_path) -> None:
    path = tmp_path / "dev.json"
    path.write_text(PRESETS["rtx3090"].to_json())
    assert load_device_file(path) == PRESETS["rtx3090"]


def test_file_may_relabel_sources(tmp_path) -> None:
    path = tmp_path / "probe.toml"
    path.write_text('base = "h100"\ndram_bw_bytes_per_s = 3.0e12\n[source]\ndram_bw_bytes_per_s = "measured"\n')
    assert load_device_file(path).source_of("dram_bw_bytes_per_s") == "measured"


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ('base = "a100"\nsm_count = \n', "not valid TOML"),
        ('base = "a100"\nsm_cuont = 10\n', "'sm_cuont'"),
        ('base = "a100"\ndram_bw_bytes_per_s = -1.0\n', "'dram_bw_bytes_per_s'"),
        ('base = "a100"\nsm_count = "80"\n', "'sm_count'"),
        ('base = "a100"\nsm_count = 80.5\n', "'sm_count'"),
        ('base = "a100"\nmax_smem_per_block_bytes = 200000\n', "'max_smem_per_block_bytes'"),
        ('base = "a100"\ncompute_capability = [8]\n', "'compute_capability'"),
        ('base = "a100"\nnvrtc_arch = "compute_80"\n', "'nvrtc_arch'"),
        ('base = "b200"\n', "'base'"),
        ('sm_count = 80\n', "missing key"),
        ('base = "a100"\n[source]\nsm_count = "guess"\n', "'source.sm_count'"),
        ('base = "a100"\nsm_count = 1000000000\n', "'sm_count' = 1000000000 is beyond any real GPU"),
        ('base = "a100"\nmemory_bytes = 1e30\n', "'memory_bytes'"),
        ('base = "a100"\nmemory_bytes = 0\n', "'memory_bytes' must be > 0"),
        ('base = "a100"\nclock_hz = 1.4e15\n', "'clock_hz'"),
        ('base = "a100"\nwarp_size = 1\nmax_threads_per_block = 32\n', "'warp_size' must be 32"),
    ],
)
def test_malformed_file_raises_one_line_device_error(tmp_path, text: str, expect: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(DeviceError) as info:
        load_device_file(path)
    message = str(info.value)
    assert expect in message
    assert str(path) in message
    assert "\n" not in message


def test_unknown_key_suggests_the_close_field(tmp_path) -> None:
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"base": "v100", "l2_byte": 1}))
    with pytest.raises(DeviceError, match="did you mean 'l2_bytes'"):
        load_device_file(path)


def test_missing_file_and_bad_json(tmp_path) -> None:
    with pytest.raises(DeviceError, match="cannot read"):
        load_device_file(tmp_path / "nope.toml")
    path = tmp_path / "bad.json"
    path.write_text("{")
    with pytest.raises(DeviceError, match="not valid JSON"):
        get_device(str(path))


def test_device_constructor_validates() -> None:
    values = A100.to_dict() | {"warp_size": 0}
    with pytest.raises(DeviceError, match="'warp_size'"):
        Device(**values)
    assert set(FIELDS) == set(A100.to_dict())


# --- occupancy ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "threads", "regs", "smem", "expected"),
    [
        # 8 warps/block; 64 regs x 32 = 2048 regs/warp; 16384 regs per sub-partition -> 8 warps x 4 = 32
        # warps/SM -> 4 blocks (threads alone would allow 64/8 = 8).
        (A100, 256, 64, 0, (4, "registers")),
        # 48 KiB + 1 KiB reserved = 50176 B/block; 167936 // 50176 = 3.
        (A100, 128, 32, 48 * KiB, (3, "shared_memory")),
        # 1 warp/block: 64 warps would fit, but an SM holds at most 32 blocks.
        (A100, 32, 16, 0, (32, "blocks_per_sm")),
        # 1536 threads/SM on GA102: 48 warps // 24 warps = 2 blocks of 768 threads.
        (PRESETS["rtx3090"], 768, 32, 0, (2, "threads")),
        # Volta allocates smem in 256 B units and reserves none: 24576 B -> 98304 // 24576 = 4 blocks,
        # one byte more rounds to 24832 B -> 3 blocks.
        (V100, 64, 32, 24 * KiB, (4, "shared_memory")),
        (V100, 64, 32, 24 * KiB + 1, (3, "shared_memory")),
        # Threads (64 // 2 warps), registers (64 warps // 2) and the block cap all give 32: the tie is
        # reported as the first limiter, threads.
        (V100, 64, 32, 0, (32, "threads")),
        # 40 regs x 32 = 1280 -> rounds up to 1280 (5 x 256); 16384 // 1280 = 12 warps/partition = 48/SM
        # -> 48 // 4 = 12 blocks of 128 threads (threads allow 16).
        (V100, 128, 40, 0, (12, "registers")),
        # Exactly the largest block on H100: 227 KiB + 1 KiB reserved = 228 KiB = the whole SM.
        (PRESETS["h100"], 256, 32, 227 * KiB, (1, "shared_memory")),
    ],
)
def test_resident_blocks_hand_computed(device, threads, regs, smem, expected) -> None:
    assert resident_blocks_per_sm(device, threads, regs, smem) == expected


@pytest.mark.parametrize(
    ("threads", "regs", "smem", "limiter"),
    [
        (1025, 32, 0, "threads"),
        (0, 32, 0, "threads"),
        (256, 256, 0, "registers"),
        # 65 regs -> 2080 -> 2304 per warp; 32 warps x 2304 = 73728 > 65536.
        (1024, 65, 0, "registers"),
        (128, 32, 163 * KiB + 1, "shared_memory"),
    ],
)
def test_block_that_cannot_fit_returns_zero_with_reason(threads, regs, smem, limiter) -> None:
    blocks, reason = resident_blocks_per_sm(A100, threads, regs, smem)
    assert blocks == 0
    assert reason.startswith(f"{limiter}: ")


@given(
    preset=st.sampled_from(sorted(PRESETS)),
    threads=st.integers(1, 1024),
    regs=st.integers(0, 255),
    smem=st.integers(0, 228 * KiB),
)
def test_resident_blocks_never_exceed_any_resource(preset, threads, regs, smem) -> None:
    device = PRESETS[preset]
    blocks, limiter = resident_blocks_per_sm(device, threads, regs, smem)
    if blocks == 0:
        assert ":" in limiter
        return
    warps = -(-threads // 32)
    assert blocks <= device.max_blocks_per_sm
    assert blocks * warps * 32 <= device.max_threads_per_sm
    assert blocks * (smem + device.reserved_smem_per_block_bytes) <= device.smem_per_sm_bytes
    assert blocks * warps * regs * 32 <= device.regs_per_sm
    # When something other than the block cap limits, lifting the cap changes nothing.
    bigger = dataclasses.replace(device, max_blocks_per_sm=blocks + 1, source=device.source)
    if limiter != "blocks_per_sm":
        assert resident_blocks_per_sm(bigger, threads, regs, smem)[0] == blocks


@pytest.mark.parametrize("name, preset", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                          ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA GeForce RTX 3090", "rtx3090"),
                                          ("NVIDIA L4", "a100")])
def test_the_cuda_backend_plans_for_the_preset_matching_the_attached_gpu(name, preset):
    from engine.device import preset_for_gpu

    assert preset_for_gpu(name) == preset
    assert preset_for_gpu(name, default="h100") == (preset if preset != "a100" or "A100" in name else "h100")


def test_without_a_gpu_the_cuda_default_is_the_default_preset():
    from engine.runtime.cuda_driver import cuda_available
    from engine.runtime.execute import attached_preset

    if cuda_available()[0]:
        pytest.skip("a GPU is attached")
    assert attached_preset("rtx3090") == "rtx3090"
