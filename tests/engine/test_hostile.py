"""The hostile corpus (tests/data/bad/, written by tests/data/make_bad.py) through the CLI: every file
is refused with exit code 2 and exactly one `error:` line naming the reason (MANIFEST.json's phrase),
no traceback, no hang, and nothing written anywhere but the run's own temporary folders."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, TEST_DATA

from engine.cli import main

BAD = TEST_DATA / "bad"
MANIFEST = json.loads((BAD / "MANIFEST.json").read_text())
ENTRIES = MANIFEST["files"]
PLAN_MODEL = ROOT / MANIFEST["plan_model"]
SECONDS = 60  # per file: a refusal is instant; anything near this is a hang
ESCAPES = (Path("/tmp/tileweave_evil.txt"), ROOT.parent / "evil.txt", ROOT / "evil.txt", BAD.parent / "evil.txt")


def cli_argv(entry: dict, out: Path) -> list[str]:
    """The command a user would type for this kind of file."""
    path = str(BAD / entry["file"])
    if entry["kind"] == "model":
        return ["run", path, "--outputs", str(out)]
    if entry["kind"] in ("plan", "bundle"):  # run uses the loaded plan itself (plan --plan-in replays it)
        return ["run", str(PLAN_MODEL), "--plan-in", path, "--backend", "cpu", "--outputs", str(out)]
    assert entry["kind"] == "device", entry
    return ["plan", str(PLAN_MODEL), "--device", path]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def test_corpus_is_large_and_complete():
    assert len(ENTRIES) >= 50
    kinds = {e["kind"] for e in ENTRIES}
    assert kinds == {"model", "plan", "bundle", "device"}
    for e in ENTRIES:
        assert (BAD / e["file"]).exists() or (BAD / e["file"]).is_symlink(), e
        assert e["expect"], e  # every refusal is checked for its reason, not only for exit code 2


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd, HOME and the compile cache under tmp_path; the run's output folder is tmp_path/out."""
    for name in ("work", "home", "cache", "out"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _timeout(signum, frame):
    raise TimeoutError(f"no answer within {SECONDS} s")


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_cli_refuses_in_one_line(entry, sandbox, capsys):
    before = snapshot(BAD)
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS)
    try:
        code = main(cli_argv(entry, sandbox / "out" / "o.npz"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err + out
    assert entry["expect"] in lines[0], (entry["expect"], lines[0])
    assert not any((sandbox / "out").iterdir())  # refused before writing any output
    assert not any((sandbox / "work").iterdir()) and not any((sandbox / "home").iterdir())
    assert snapshot(BAD) == before
    assert not any(p.exists() for p in ESCAPES)


@pytest.mark.parametrize("name", ["garbage.onnx", "huge_input_shape.onnx", "plan_other_model.plan.json",
                                  "bundle_zip_slip.zip", "device_sm_count_huge.toml"])
def test_cli_process_exits_2_without_traceback(name, sandbox):
    """The same through a real `python -m engine` process: exit status, stderr and wall time."""
    entry = next(e for e in ENTRIES if e["file"] == name)
    proc = subprocess.run([sys.executable, "-m", "engine", *cli_argv(entry, sandbox / "out" / "o.npz")],
                          capture_output=True, text=True, timeout=120, cwd=sandbox / "work")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and entry["expect"] in lines[0] and "Traceback" not in proc.stderr
    assert not any((sandbox / "out").iterdir())
