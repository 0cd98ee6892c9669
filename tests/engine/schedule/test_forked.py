"""A forked child beside the welder walk (engine/schedule/forked.py): it searches the later half of a graph whose
later layers are new and makes the stitch plan the walk's is held against; the plan is the in-process one, the
child's tile searches are merged back, and any failure of the child is planned around."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.errors import TileweaveError
from engine.memo import Caches, memo
from engine.schedule.forked import Forked, can_fork, fork_enabled

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_value_and_new_table_entries_come_back():
    with Caches("forked").active():
        memo("forked.table", 100).put("old", 1)

        def work(send):
            memo("forked.table", 100).put("new", [2, 3])
            send({"answer": 42})
            memo("forked.table", 100).put("newer", 4)
            send("second")

        child = Forked(work, {"forked.table": 100})
        assert child.result() == {"answer": 42}
        table = memo("forked.table", 100)
        assert table.get("new") == [2, 3] and table.get("old") == 1 and not table.has("newer")
        assert child.result() == "second" and table.get("newer") == 4
        assert child.result() is None  # the child has ended: no third message
        child.close()
        child.close()


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_failed_child_gives_none(how):
    def work(send):
        if how == "raise":
            raise RuntimeError("boom")
        os._exit(3)

    child = Forked(work)
    assert child.result() is None
    child.close()


def test_close_ends_the_child():
    child = Forked(lambda send: time.sleep(60))
    pid = child._pid
    child.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no such child any more


def test_flag_values(monkeypatch):
    monkeypatch.setenv("TILEWEAVE_PLAN_FORK", "off")
    assert not fork_enabled() and not can_fork()
    monkeypatch.setenv("TILEWEAVE_PLAN_FORK", "on")
    assert fork_enabled()
    monkeypatch.setenv("TILEWEAVE_PLAN_FORK", "sometimes")
    with pytest.raises(TileweaveError, match="TILEWEAVE_PLAN_FORK='sometimes' is not on or off"):
        fork_enabled()


_PLAN = r"""
import json, sys
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model
from engine.schedule.plan import plan_to_json

_, plan = plan_model(load_graph(sys.argv[1]), "welder", get_device(sys.argv[2]))
out = plan_to_json(plan)
out.pop("schedule_seconds")
print(json.dumps(out, sort_keys=True))
"""


def _plan(model: Path, device: str, fork: str) -> tuple[str, str]:
    env = dict(os.environ, TILEWEAVE_PLAN_FORK=fork, TILEWEAVE_SCHEDULE_CACHE="off", DEBUG="1",
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _PLAN, str(model), device], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a child is forked only with a core to spare")
@pytest.mark.parametrize("name", ["gpt2", "convnext"])
def test_the_forked_stitch_plan_is_the_in_process_one(name):
    """Zoo gpt2 and convnext on host: the walk's plan is held against a stitch plan the floor does not rule out,
    so the child's plan is taken (convnext's child warms the later half's searches first); the welder plan
    (decisions, groups, tiles, costs, every edge's reason) is the one made without a fork."""
    model = ROOT / "samples" / "zoo" / f"{name}.onnx"
    forked, log = _plan(model, "host", "on")
    assert "the stitch plan from a forked child" in log
    alone, log_alone = _plan(model, "host", "off")
    assert "forked child" not in log_alone
    assert json.loads(forked) == json.loads(alone)
    verdict = next(d for d in json.loads(forked)["decisions"] if d.startswith("welder:"))
    assert "the stitch policy's" in verdict and "at least" not in verdict  # compared, not ruled out by the floor


def test_a_bad_flag_is_a_one_line_cli_error(monkeypatch, capsys):
    from engine.cli import main

    monkeypatch.setenv("TILEWEAVE_PLAN_FORK", "sometimes")
    assert main(["plan", str(ROOT / "samples" / "layernorm_residual.onnx"), "--policy", "welder"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TILEWEAVE_PLAN_FORK='sometimes' is not on or off" in err[0], err


def test_split_only_where_the_later_half_is_new():
    """The child warms the later half's searches of graphs whose later stages are unlike the earlier ones
    (zoo swin's stages, efficientnet's blocks), not where they repeat them (bert12's layers)."""
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import batch_graph
    from engine.schedule.policies.welder import _split_at

    zoo = ROOT / "samples" / "zoo"
    assert _split_at(batch_graph(load_graph(zoo / "swin.onnx"))[0]) > 0
    assert _split_at(batch_graph(load_graph(zoo / "efficientnet.onnx"))[0]) > 0
    assert _split_at(batch_graph(load_graph(ROOT / "samples" / "bert12.onnx"))[0]) == 0
    assert _split_at(load_graph(ROOT / "samples" / "layernorm_residual.onnx")) == 0  # small: no fork's worth


def test_renamed_refusals_name_the_asking_group():
    """A cached refusal names the asking group's stages, rule 7's "first.." included (it named the stage of the
    layer searched first: zoo mobilevit's add_9 -> add_10 refusal said permute_3, a stage of another block)."""
    from engine.schedule.tiles import _sub

    text = "rule segment_sink: segment s3.. has 2 sinks (s5, s7); stage s3 of x1"
    assert _sub(text, {"s3": "permute_4", "s5": "matmul_9", "s7": "add_10"}) == (
        "rule segment_sink: segment permute_4.. has 2 sinks (matmul_9, add_10); stage permute_4 of x1")
