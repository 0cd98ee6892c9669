"""The memo tables (engine/memo.py): bounded, counted, thread-safe, owned by a session; and the subgraph
signature they key on is canonical in every tensor a group reads, gathered index tensors included."""

from __future__ import annotations

import threading

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.memo import PROCESS, Caches, Memo, current, memo


def test_a_table_keeps_its_most_recently_used_entries_and_counts_lookups():
    rng = np.random.default_rng(7)
    table = Memo("t", limit=4)
    keys = [int(k) for k in rng.permutation(1000)[:6]]
    for k in keys[:4]:
        table.put(k, k * 3)
    assert table.get(keys[0]) == keys[0] * 3  # keys[0] is now the most recent
    table.put(keys[4], 1)
    table.put(keys[5], 2)  # two least recently used leave: keys[1], keys[2]
    assert len(table) == 4
    assert table.get(keys[1]) is None and table.get(keys[2]) is None
    assert table.get(keys[0]) == keys[0] * 3 and table.get(keys[3]) == keys[3] * 3
    assert table.stats() == {"entries": 4, "limit": 4, "hits": 3, "misses": 2}
    calls = []
    assert table.lookup("new", lambda: calls.append(1) or 11) == 11
    assert table.lookup("new", lambda: calls.append(1) or 12) == 11
    assert calls == [1]


def test_sessions_own_their_tables_and_threads_start_on_the_process_tables():
    a, b = Caches("a"), Caches("b")
    with a.active():
        memo("demo", 10).put("k", "from a")
        assert current() is a
        with b.active():
            assert memo("demo", 10).get("k") is None
        assert memo("demo", 10).get("k") == "from a"
    assert current() is PROCESS
    seen = []
    with a.active():
        t = threading.Thread(target=lambda: seen.append(current()))
        t.start()
        t.join()
    assert seen == [PROCESS]  # a thread does not inherit the session: the app activates it per run


def test_a_table_stays_consistent_under_threads():
    table = Memo("t", limit=64)
    rng = np.random.default_rng(3)
    streams = [[int(x) for x in rng.integers(0, 200, 3000)] for _ in range(4)]
    wrong = []

    def work(keys):
        for k in keys:
            if table.lookup(k, lambda k=k: k * k) != k * k:
                wrong.append(k)

    threads = [threading.Thread(target=work, args=(s,)) for s in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and len(table) <= 64
    assert table.hits + table.misses == sum(map(len, streams))


def test_debug_report_lists_every_table():
    caches = Caches("x")
    caches.memo("one", 5).put(1, 1)
    caches.memo("one", 5).get(1)
    caches.memo("two", 5).get(2)
    text = caches.report()
    assert "one" in text and "two" in text and "100%" in text and "0%" in text


def _two_embeddings(swap: bool) -> onnx.ModelProto:
    """Two Gathers of one shape, each through its own index tensor; `swap` names the index tensors the
    other way round."""
    rng = np.random.default_rng(11)
    w1 = numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "w2")
    ia, ib = ("ids_b", "ids_a") if swap else ("ids_a", "ids_b")
    nodes = [helper.make_node("Gather", ["w1", ia], ["e1"], name="g1"),
             helper.make_node("Gather", ["w2", ib], ["e2"], name="g2"),
             helper.make_node("Add", ["e1", "e2"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "emb", [helper.make_tensor_value_info(n, TensorProto.INT64, [3]) for n in ("ids_a", "ids_b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_group_signature_renames_gathered_index_tensors(tmp_path):
    from engine.frontend.importer import load_graph
    from engine.schedule.plan import Conn
    from engine.schedule.tiles import group_signature

    sigs = []
    for swap in (False, True):
        path = tmp_path / f"emb{swap}.onnx"
        onnx.save(_two_embeddings(swap), path)
        graph = load_graph(path)
        gathers = ["e1", "e2"]
        assert all(set(graph.stage(g).inputs) & {"ids_a", "ids_b"} for g in gathers)
        sigs.append([group_signature(graph, [g], {}) for g in gathers])
        add = graph.stage(graph.outputs[0])
        whole = [*gathers, add.name]
        conns = {(g, add.name): Conn.REGISTER for g in gathers}
        sigs[-1].append(group_signature(graph, whole, conns))
    # Each Gather alone reads its own index tensor: the same structure whatever the tensor is called.
    assert sigs[0][0] == sigs[0][1] == sigs[1][0] == sigs[1][1]
    # The whole group reads both: swapping the names swaps nothing structural either.
    assert sigs[0][2] == sigs[1][2]
