"""A forked child beside the welder walk (engine/schedule/forked.py): it searches the later half of a graph whose
later layers are new, or each stage alone, makes the stitch plan the walk's is held against, and answers the walk's
requests for an edge's second-level search; the plan is the in-process one, the child's tile searches are merged
back, and any failure of the child is planned around."""

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


def test_requests_are_answered_newest_first_while_wanted():
    """The child answers requests once its work is done (or at `serve_point`): only the newest it finds, only
    while the caller wants it; `answer` gives None for one the child has not started."""
    def serve(request):
        if request == "slow":
            time.sleep(0.3)
        return request * 2

    child = Forked(lambda send: (time.sleep(0.3), send("free")), serve=serve)
    try:
        child.ask(1, 1)
        child.ask(2, 2)  # both while the child is at its work: the second replaces the first
        assert child.result() == "free"
        assert child.answer(2, wait=True) == 4
        assert child.answer(1) is None
        child.ask(3, "slow")
        while not child.serving() or child._get(8) != 3:  # the child is at request 3
            time.sleep(0.01)
        child.ask(4, 4)
        child.drop(4)  # wanted no more before the child is free: never started
        assert child.answer(3) == "slowslow"  # started: the caller waits for it
        child.ask(5, 5)
        assert child.answer(5, wait=True) == 10
        assert child.answer(4) is None and 4 not in child._got
    finally:
        child.close()


def test_a_search_pass_in_the_child_answers_requests_but_not_inside_one():
    """A tile search's pass has a serve point per candidate: a child busy with long searches (the stitch plan)
    answers the walk's requests between candidates, not only between edges — and a serve point reached inside
    a served search answers nothing (no request within a request)."""
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule import forked
    from engine.schedule.plan import Conn
    from engine.schedule.tiles import search_group

    graph, dev = load_graph(ROOT / "samples" / "bert_layer.onnx"), get_device("a100")
    stages = [s.name for s in graph.stages[:6]]
    conns = {e: Conn.REGISTER for e in graph.edges if e[0] in stages and e[1] in stages}
    nested: list = []

    def serve(request):
        if request == 41:
            time.sleep(0.3)  # the caller's next request comes meanwhile
        before = forked._SERVING.version
        forked.serve_point()  # inside a served request: must not read (and serve) the next one
        nested.append(forked._SERVING.version != before)
        return request + 1, any(nested)

    def work(send):
        while forked._SERVING.parent._get(0) != 1:  # the caller's request is in the slot before the search starts
            time.sleep(0.01)
        with Caches("pass").active():  # a cold search: its passes reach their serve points
            search_group(graph, stages, conns, dev, "welder", k=1)
        send(forked._SERVING.version)  # the slot's version the child last read, before its work ended

    child = Forked(work, serve=serve)
    try:
        child.ask(1, 41)
        while child._get(8) != 1:  # the child is at request 1 (inside its search's pass)
            time.sleep(0.01)
        child.ask(2, 9)  # while request 1 is served (the caller asks one at a time: this is the next one)
        assert child.answer(2, wait=True) == (10, False)
        assert child.answer(1) == (42, False)  # came first; request 2 was not served inside it
        assert child.result() > 0  # both read inside the search, not after the work
    finally:
        child.close()


def test_a_failed_request_or_child_gives_none():
    """A request whose work raises is answered None (the caller searches itself) and the child goes on answering;
    a child that dies answers None from then on, without the caller waiting."""
    def serve(request):
        if request == "bad":
            raise ValueError("no")
        return request + 1

    child = Forked(lambda send: None, serve=serve)
    try:
        child.ask(1, "bad")
        assert child.answer(1, wait=True) is None
        child.ask(2, 2)
        assert child.answer(2, wait=True) == 3
        os.kill(child._pid, 9)
        os.waitpid(child._pid, 0)
        child.ask(3, 3)  # to a child that is gone: no error
        assert child.answer(3, wait=True) is None and not child.serving()
        child.ask(4, 4)  # no error: nothing is sent any more
        assert child.answer(4) is None and child.result() is None
    finally:
        child.close()


def test_shared_and_served_entries_come_back_as_safe_allows():
    """`send.share()` sends the entries `safe` allows at once; a served request's work keeps its search tables
    apart from the child's own (what the child sends later does not hold them) and brings back the safe ones."""
    from engine.schedule.forked import serve_point

    with Caches("forked").active():
        memo("tiles.subgraph", 100).put("old", 1)
        served: list = []

        def work(send):
            memo("forked.table", 100).put("good", 1)
            memo("forked.table", 100).put("bad", -1)
            send.share()
            while not served:  # answer the request inside its work
                serve_point()
                time.sleep(0.005)
            send(memo("tiles.subgraph", 100).has("served-good"))

        def serve(request):
            served.append(request)
            memo("tiles.subgraph", 100).put("served-good", request)
            memo("tiles.subgraph", 100).put("served-bad", -request)
            return memo("tiles.subgraph", 100).has("old")  # the served search tables start empty

        child = Forked(work, {"forked.table": 100, "tiles.subgraph": 100}, serve, lambda name, value: value > 0)
        try:
            child.ask(1, 7)
            assert child.answer(1, wait=True) is False
            table = memo("tiles.subgraph", 100)
            assert table.get("served-good") == 7 and not table.has("served-bad")
            assert memo("forked.table", 100).get("good") == 1 and not memo("forked.table", 100).has("bad")
            assert child.result() is False  # the child's own search table never held the served entries
            assert memo("forked.table", 100).get("bad") == -1  # a message brings every entry
        finally:
            child.close()


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
@pytest.mark.parametrize("name", ["resnet", "swin"])
def test_the_forked_stitch_plan_is_the_in_process_one(name):
    """Zoo resnet and swin on host: the walk's plan is held against a stitch plan the floor does not rule out,
    so the child's plan is taken (swin's child warms the later half's searches first); the welder plan
    (decisions, groups, tiles, costs, every edge's reason) is the one made without a fork."""
    model = ROOT / "samples" / "zoo" / f"{name}.onnx"
    forked, log = _plan(model, "host", "on")
    assert "the stitch plan from a forked child" in log
    alone, log_alone = _plan(model, "host", "off")
    assert "forked child" not in log_alone
    assert json.loads(forked) == json.loads(alone)
    verdict = next(d for d in json.loads(forked)["decisions"] if d.startswith("welder:"))
    assert "the stitch policy's" in verdict and "at least" not in verdict  # compared, not ruled out by the floor


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a child is forked only with a core to spare")
@pytest.mark.parametrize("name", ["llama", "lstm"])
def test_searches_the_child_answered_leave_the_plan_as_it_is(name):
    """Zoo llama and lstm on host (the floor rules their stitch plans out, so the child searches each stage alone
    and answers the walk's requests): the child answers some of the walk's second-level searches, and the plan
    (every edge's reason included) is the one made without a fork."""
    import re

    model = ROOT / "samples" / "zoo" / f"{name}.onnx"
    forked, log = _plan(model, "host", "on")
    used = re.search(r"welder: (\d+) of the (\d+) second-level searches asked of the forked child came from it", log)
    assert used and int(used[1]) > 0, log[-2000:]
    alone, _ = _plan(model, "host", "off")
    assert json.loads(forked) == json.loads(alone)


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


class _Recorder:
    """Stands in for `build.SearchAhead` (the walk's `ahead`): records each second-level search the walk
    would ask for and the bound it then searches under; answers none (the walk searches itself)."""

    def __init__(self):
        self.asked: list = []
        self.current = None

    def before(self, graph, conns, edge, listed, device, mode, group_of_stage, kept, standing):
        from engine.schedule.build import trial_search
        from engine.schedule.validate import Decision

        listed, self.current = list(listed), None
        if len(listed) > 1:
            prep = trial_search(graph, conns, edge, listed[1][0], device, mode, group_of_stage.__getitem__, False,
                                kept, standing)
            if not isinstance(prep[0], Decision):
                self.current = (edge, listed[1][0], prep)

    def take(self, edge, level, bound):
        if self.current is not None and self.current[:2] == (edge, level):
            self.asked.append((self.current[2], bound))
        return None


@pytest.mark.parametrize("model", ["bert_layer", "vit_block", "lstm"])
def test_an_answer_under_a_wider_bound_is_the_search_under_the_tighter_one(model):
    """For every second-level search a welder walk makes (host), `under_tighter` of the search under the
    sides' figure alone (what the child searches) is, where it answers, what the search under the walk's
    tighter bound finds — tiles, cost, "nothing under" and refusals alike — each searched with empty tables."""
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule import build
    from engine.schedule.policies.welder import welder_fallback, welder_levels
    from engine.schedule.tiles import search_group, under_tighter

    graph, device = load_graph(ROOT / "samples" / f"{model}.onnx"), get_device("host")
    recorder = _Recorder()
    with Caches("walk").active():
        build.connect_greedy(graph, device, "welder", welder_levels, welder_fallback, ahead=recorder)
    assert recorder.asked
    answered = tighter = 0
    for (stages, trial, fixed, _, limit), bound in recorder.asked:
        with Caches("wide").active():
            wide = search_group(graph, stages, trial, device, "welder", fixed, k=1, bound=limit)
        with Caches("own").active():
            own = search_group(graph, stages, trial, device, "welder", fixed, k=1, bound=bound)
        got = under_tighter(wide, limit, bound)
        if got is None:
            assert wide.violations
            continue
        answered += 1
        tighter += bound < limit
        assert (got.tiles, got.above, got.violations) == (own.tiles, own.above, own.violations)
        assert (got.cost.modeled_us if got.cost else None) == (own.cost.modeled_us if own.cost else None)
    assert answered and tighter  # the walk's bound was the tighter one in some of them
