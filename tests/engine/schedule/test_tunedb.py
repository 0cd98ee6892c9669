"""engine/schedule/tunedb.py: the tuning database's keys, record-once writes, JSON-lines merge, and a second
tune served from it; `tileweave tune --in-process` end to end on the host (no Ray: test_tune_ray.py)."""

from __future__ import annotations

import dataclasses
import json
import threading

import numpy as np
import pytest
from support import sample_path

from engine.api import load_graph
from engine.cli import main
from engine.device import get_device
from engine.schedule.pipeline import plan_model
from engine.schedule.tune import finish_tune, prepare_tune, run_local, tune_plan
from engine.schedule.tunedb import TuneDB, TuneDBError, device_key, new_rows
from engine.schedule.validate import validate


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    monkeypatch.delenv("TILEWEAVE_TUNE_DB", raising=False)


def rows(rng, device, version="v1", task="t0", n=3):
    times = {f"k{j}": float(rng.uniform(1, 100)) for j in range(n)}
    return new_rows(task, {k: f"sig-{k}" for k in times}, times, device, version, 7, model="m", policy="welder",
                    worker="w:1"), times


def test_rows_round_trip_and_are_keyed_by_device_figures_and_code_version(tmp_path):
    rng = np.random.default_rng(1)
    v100, a100 = get_device("v100"), get_device("a100")
    with TuneDB(tmp_path / "t.sqlite") as db:
        written, times = rows(rng, a100)
        assert db.record(written) == 3
        got = db.lookup(["sig-k0", "sig-k1", "sig-k2", "sig-none"], a100, "v1")
        assert got == pytest.approx({f"sig-{k}": v for k, v in times.items()})
        assert db.lookup(["sig-k0"], a100, "v2") == {}  # another code version
        assert db.lookup(["sig-k0"], v100, "v1") == {}  # another device
        faster = dataclasses.replace(a100, dram_bw_bytes_per_s=a100.dram_bw_bytes_per_s * 2)  # same name, other figures
        assert device_key(faster)[0] == "a100" and db.lookup(["sig-k0"], faster, "v1") == {}
        assert {dataclasses.astuple(r) for r in db.rows()} == {dataclasses.astuple(r) for r in written}
    with TuneDB(tmp_path / "t.sqlite") as again:  # on disk
        assert again.count() == 3


def test_a_task_recorded_twice_counts_once_and_lookups_are_medians_over_tasks(tmp_path):
    rng = np.random.default_rng(2)
    a100 = get_device("a100")
    with TuneDB(tmp_path / "t.sqlite") as db:
        first, t1 = rows(rng, a100, task="task-a")
        assert db.record(first) == 3
        rerun = [dataclasses.replace(r, us=r.us * 5, worker="w:2") for r in first]  # the retried task's result
        assert db.record(rerun) == 0 and db.count() == 3
        assert db.lookup(["sig-k0"], a100, "v1")["sig-k0"] == pytest.approx(t1["k0"])
        second, t2 = rows(rng, a100, task="task-b")
        third, t3 = rows(rng, a100, task="task-c")
        db.record(second + third)
        want = float(np.median([t1["k1"], t2["k1"], t3["k1"]]))
        assert db.lookup(["sig-k1"], a100, "v1")["sig-k1"] == pytest.approx(want)


def test_concurrent_writers_lose_nothing(tmp_path):
    a100 = get_device("a100")
    path = tmp_path / "t.sqlite"
    TuneDB(path).close()

    def write(w):
        rng = np.random.default_rng(w)
        with TuneDB(path) as db:
            for t in range(20):
                db.record(rows(rng, a100, task=f"w{w}-t{t}")[0])
                db.record(rows(rng, a100, task=f"w{w}-t{t}")[0])  # a duplicate of each task

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with TuneDB(path) as db:
        assert db.count() == 3 * 20 * 3


def test_jsonl_export_and_import_merge(tmp_path):
    rng = np.random.default_rng(3)
    a100, v100 = get_device("a100"), get_device("v100")
    with TuneDB(tmp_path / "cluster.sqlite") as cluster, TuneDB(tmp_path / "laptop.sqlite") as laptop:
        shared, _ = rows(rng, a100, task="shared")
        cluster.record(shared + rows(rng, a100, task="c1")[0])
        laptop.record(shared + rows(rng, v100, task="l1")[0])
        assert cluster.export_jsonl(tmp_path / "c.jsonl") == 6
        lines = (tmp_path / "c.jsonl").read_text().splitlines()
        assert len(lines) == 6 and {"task_id", "signature", "device_hash", "code_version", "us"} <= json.loads(lines[0]).keys()
        assert laptop.import_jsonl(tmp_path / "c.jsonl") == (6, 3)  # the shared task is there already
        assert laptop.import_jsonl(tmp_path / "c.jsonl") == (6, 0)
        assert laptop.count() == 9
        merged = {(r.task_id, r.signature) for r in laptop.rows()}
        assert {(r.task_id, r.signature) for r in cluster.rows()} <= merged


@pytest.mark.parametrize("text, needle", [
    ("{not json\n", "not a JSON object"),
    ("[1, 2]\n", "not a JSON object"),
    ('{"task_id": "t"}\n', "a measurement without signature"),
    ('{"task_id": "t", "signature": "s", "device": "a100", "device_hash": "h", "code_version": "v", "us": -1, '
     '"launches": 7}\n', "us=-1"),
])
def test_a_bad_import_is_one_line_and_writes_nothing(tmp_path, text, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    with TuneDB(tmp_path / "t.sqlite") as db:
        with pytest.raises(TuneDBError, match=needle) as err:
            db.import_jsonl(bad)
        assert "\n" not in str(err.value) and db.count() == 0


def test_a_file_that_is_not_a_database_is_one_line(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(np.random.default_rng(4).bytes(4096))
    with pytest.raises(TuneDBError, match="cannot be opened"):
        TuneDB(junk)


def noisy(seed: int, calls: list):
    """A measure function: each kernel's modeled time times a random factor fixed per kernel signature."""
    rng = np.random.default_rng(seed)
    factor: dict = {}

    def measure(plan):
        calls.append(plan)
        return {g.name: g.cost.modeled_us * factor.setdefault((g.stages, g.segments), rng.uniform(0.5, 2.0))
                for g in plan.groups}
    return measure


def test_a_second_tune_is_served_from_the_database(tmp_path):
    device = get_device("a100")
    graph, plan = plan_model(load_graph(sample_path("layernorm_residual")), "welder", device)
    calls: list = []
    with TuneDB(tmp_path / "t.sqlite") as db:
        first = tune_plan(graph, plan, device, 2, measure=noisy(5, calls), db=db)
        assert calls and db.count() > 0
        job = prepare_tune(graph, plan, device, 2, db=db)
        assert job.tasks == [] and job.known
        calls.clear()
        again = finish_tune(job, db)
        assert again.groups == first.groups and not calls
        assert any("0 program(s) run" in d for d in again.decisions)
        assert all(row["from_db"] and row["measured_us"] is not None for row in job.candidates())


def test_tasks_of_a_job_and_their_rows(tmp_path):
    """One task per variant the database cannot serve; its rows name the task, the kernels and the worker."""
    device = get_device("a100")
    graph, plan = plan_model(load_graph(sample_path("masked_softmax")), "welder", device)
    calls: list = []
    with TuneDB(tmp_path / "t.sqlite") as db:
        job = prepare_tune(graph, plan, device, 2, db=db, model="ms")
        assert len({t.task_id for t in job.tasks}) == len(job.tasks) > 1
        run_local(job.tasks, {graph.structural_hash: noisy(6, calls)}, db, device)
        assert len(calls) == len(job.tasks)
        written = db.rows()
        assert len(written) == sum(len(t.signatures) for t in job.tasks)
        assert {r.model for r in written} == {"ms"} and all(r.worker and r.launches == 7 for r in written)
        tuned = finish_tune(job, db)
        assert not validate(tuned, graph, device)


def test_cli_tune_in_process_measures_once_and_exports(tmp_path, capsys):
    db, out = str(tmp_path / "t.sqlite"), tmp_path / "t.jsonl"
    model = str(sample_path("masked_softmax"))
    assert main(["tune", model, "--in-process", "--db", db, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["tasks"] > 0 and first["rows"][0]["measured"] == first["tasks"]
    assert first["rows"][0]["tuned_us"] <= first["rows"][0]["untuned_us"] + 1e-3
    assert main(["tune", model, "--in-process", "--db", db, "--export-db", str(out)]) == 0
    captured = capsys.readouterr()
    assert "0 task(s) measured" in captured.out and "db hits" in captured.err
    with TuneDB(db) as written:
        assert len(out.read_text().splitlines()) == written.count() > 0
    fresh = str(tmp_path / "fresh.sqlite")
    assert main(["tune", "--import-db", str(out), "--db", fresh]) == 0
    assert main(["tune", model, "--in-process", "--db", fresh, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == 0


@pytest.mark.parametrize("argv, needle", [
    (["tune"], "tune needs a MODEL"),
    (["tune", "missing.onnx"], "missing.onnx"),
    (["tune", "MODEL", "--tune", "0"], "--tune 0"),
    (["tune", "MODEL", "--cluster", "not-an-address"], "is not a Ray address"),
    (["tune", "MODEL", "--cluster", "127.0.0.1:1"], "nothing answers there"),
    (["tune", "MODEL", "--in-process", "--workers", "2"], "--in-process runs without Ray"),
    (["tune", "MODEL", "--policy", "fastest"], "--policy 'fastest'"),
    (["tune", "MODEL", "--import-db", "missing.jsonl"], "--import-db missing.jsonl"),
])
def test_cli_tune_bad_input_is_one_line(capsys, argv, needle, tmp_path):
    argv = [str(sample_path("masked_softmax")) if a == "MODEL" else a for a in argv] + ["--db", str(tmp_path / "t.sqlite")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("error: ")]
    assert len(line) == 1 and needle in line[0], err
