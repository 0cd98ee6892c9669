"""`tileweave cache`: the cache folder part by part, trimming the compile caches least recently used first,
clearing what is rebuilt on demand — never the measurements (host, tune)."""

from __future__ import annotations

import json
import os
import time

import pytest

from engine import cache
from engine.cli import main
from engine.errors import TileweaveError


def _file(path, size: int, age_s: float = 0.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    return tmp_path


def test_sizes_parse_as_memory_budget_sizes_and_a_bad_one_names_its_flag():
    from engine.runtime.budget import parse_size

    assert parse_size("500M", "--prune") == 500 * 1024 ** 2
    assert parse_size("2G", "--prune") == 2 * 1024 ** 3
    assert parse_size("1.5GB", "--prune") == int(1.5 * 1000 ** 3)  # decimal with B, as --memory-budget
    assert parse_size("800k", "--prune") == 800 * 1024
    assert parse_size("1234", "--prune") == 1234
    with pytest.raises(TileweaveError, match="^--prune 'lots' is not a size"):
        parse_size("lots", "--prune")


def test_prune_removes_the_least_recently_used_programs_whole_and_never_the_measurements(folder):
    old_c = _file(folder / "cc" / "k-aaa.c", 1000, age_s=300)
    old_so = _file(folder / "cc" / "k-aaa.so", 9000, age_s=290)  # one entry with its source: used 290 s ago
    mid = _file(folder / "nvrtc" / "bbb.json", 5000, age_s=200)
    new_so = _file(folder / "cc" / "k-ccc.so", 7000, age_s=10)
    obj = _file(folder / "cc" / "obj" / "ddd.o", 2000, age_s=100)
    young_tmp = _file(folder / "cc" / ".k-eee.123.so.tmp", 4000, age_s=5)  # a compile in flight
    stale_tmp = _file(folder / "cc" / ".k-fff.456.so.tmp", 3000, age_s=2 * cache.TEMP_GRACE_S)
    pch = _file(folder / "nvrtc" / "pch" / "vm-1" / "k_0.pch", 50000, age_s=1000)
    measured = [_file(folder / "host" / "figures.json", 100, age_s=10 ** 6), _file(folder / "tune" / "tune.db", 100, 10 ** 6)]
    # 27,000 B of entries (the young temp file and the pch folder are not entries): down to 10,000 B removes
    # the stale temp file, the old program (source and library together) and the CUDA unit, oldest first,
    # and stops there (9,000 B left: the object and the newest program).
    removed, freed = cache.prune(10_000)
    assert (removed, freed) == (3, 3000 + 10000 + 5000)
    assert not any(p.exists() for p in (stale_tmp, old_c, old_so, mid))
    assert all(p.exists() for p in (obj, new_so, young_tmp, pch, *measured))


def test_a_cache_hit_marks_its_library_used(folder):
    from engine.codegen.ccompile import compile_c

    src = "int tileweave_cache_probe(void) { return 7; }\n"
    lib = compile_c(src, name="probe")
    long_ago = time.time() - 10 ** 5
    os.utime(lib, (long_ago, long_ago))
    assert compile_c(src, name="probe") == lib
    assert time.time() - lib.stat().st_mtime < 600


def test_the_command_shows_prunes_and_clears_keeping_the_measurements(folder, capsys):
    _file(folder / "cc" / "k-aaa.so", 3000, age_s=100)
    _file(folder / "nvrtc" / "bbb.json", 2000)
    _file(folder / "schedule" / "x.pkl", 500)
    _file(folder / "host" / "figures.json", 100)
    _file(folder / "tune" / "tune.db", 100)
    _file(folder / "edits" / "model.json", 100)
    live = _file(folder / "nvrtc" / "pch" / f"vm-{os.getpid()}" / "k_0.pch", 100)  # a running compile's
    assert main(["cache", "--json"]) == 0
    parts = {r["part"]: r for r in json.loads(capsys.readouterr().out)["parts"]}
    assert (parts["cc"]["files"], parts["cc"]["bytes"], parts["host"]["rebuilt"]) == (1, 3000, False)
    assert main(["cache", "--prune", "2k"]) == 0
    assert "removed 1 entries (compiled programs" in capsys.readouterr().out
    assert not (folder / "cc" / "k-aaa.so").exists() and (folder / "nvrtc" / "bbb.json").exists()
    assert main(["cache", "--clear"]) == 0
    assert "removed cc, nvrtc, schedule; kept the measurements (host, tune)" in capsys.readouterr().out
    assert list((folder / "nvrtc").iterdir()) == [folder / "nvrtc" / "pch"] and live.exists()
    assert not any((folder / "schedule").iterdir())
    assert all((folder / p).exists() for p in ("host/figures.json", "tune/tune.db", "edits/model.json"))
    assert main(["cache", "--prune", "lots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --prune 'lots' is not a size")


def test_a_compile_trims_the_caches_in_the_background_at_most_once_a_day(folder, monkeypatch):
    import threading

    monkeypatch.setenv("TILEWEAVE_CACHE_MAX", "10k")
    old = _file(folder / "cc" / "k-aaa.so", 9000, age_s=500)
    new = _file(folder / "nvrtc" / "bbb.json", 5000, age_s=5)
    cache.trim_soon()
    for t in threading.enumerate():
        if t.name == "tileweave-cache-trim":
            t.join(10)
    assert not old.exists() and new.exists() and (folder / ".trimmed").exists()
    again = _file(folder / "cc" / "k-ccc.so", 9000, age_s=400)  # over the bound again, but trimmed today
    cache.trim_soon()
    assert not any(t.name == "tileweave-cache-trim" for t in threading.enumerate()) and again.exists()


def test_the_bound_is_read_from_the_environment(monkeypatch):
    for raw, want in (("", cache.DEFAULT_MAX), ("800M", 800 * 1024 ** 2), ("off", None), ("0", None),
                      ("bad", cache.DEFAULT_MAX)):  # a compile never fails on it; `tileweave cache` says why
        monkeypatch.setenv("TILEWEAVE_CACHE_MAX", raw)
        assert cache.max_bytes() == want, raw


def test_a_bad_bound_is_one_line_from_the_command(folder, monkeypatch, capsys):
    monkeypatch.setenv("TILEWEAVE_CACHE_MAX", "bad")
    assert main(["cache"]) == 2
    assert capsys.readouterr().err.strip() == ("error: TILEWEAVE_CACHE_MAX 'bad' is not a size (write bytes or a "
                                               "number with a unit, e.g. 8GiB, 512MiB, 2GB)")
