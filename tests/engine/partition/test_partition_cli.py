"""`tileweave partition` and `tileweave run --devices`: the table, --json, --trace, and one-line errors
for bad --devices, --link and --cluster."""

from __future__ import annotations

import json

import pytest
from support import sample_path

from engine.cli import main
from engine.partition.links import get_link
from engine.rprogram.trace import validate_trace


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_partition_json_and_trace(capsys, tmp_path):
    trace = tmp_path / "t.json"
    code, out, err = run_cli(capsys, "partition", sample_path("bert_layer"), "--devices", 2, "--link", "nvlink",
                             "--json", "--trace", trace)
    assert code == 0, err
    js = json.loads(out)
    assert js["devices"] == 2 and len(js["stages"]) == 2 and js["link"]["name"] == "nvlink"
    assert {"tensor", "src", "dst", "bytes", "us"} <= set(js["transfers"][0])
    events = json.loads(trace.read_text())
    assert validate_trace(events) == []
    names = {e["args"]["name"] for e in events["traceEvents"] if e["name"] == "process_name"}
    assert names == {"device 0 (a100)", "device 1 (a100)", "links (nvlink)"}
    kernels = [e for e in events["traceEvents"] if e.get("cat", "").startswith("kernel")]
    assert len(kernels) == sum(len(s["kernels"]) for s in js["stages"])


@pytest.mark.parametrize("devices", ["0", "-2", "65"])
def test_bad_devices(capsys, devices):
    code, _, err = run_cli(capsys, "partition", sample_path("gelu_chain"), "--devices", devices)
    one_line_error(code, err, "--devices must be an integer from 1 to 64")


def test_bad_link_name_and_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "partition", sample_path("gelu_chain"), "--devices", 2, "--link", "infiniband")
    one_line_error(code, err, "unknown link 'infiniband'", "nvlink, pcie, ethernet")
    bad = tmp_path / "l.json"
    bad.write_text(json.dumps({"bandwidth_bytes_per_s": -1, "latency_s": 1e-6}))
    code, _, err = run_cli(capsys, "partition", sample_path("gelu_chain"), "--devices", 2, "--link", bad)
    one_line_error(code, err, "bandwidth_bytes_per_s", "> 0")
    bad.write_text("{not json")
    code, _, err = run_cli(capsys, "partition", sample_path("gelu_chain"), "--devices", 2, "--link", bad)
    one_line_error(code, err, "not a valid JSON link file")


def test_link_file_is_read():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ib.json"
        path.write_text(json.dumps({"bandwidth_bytes_per_s": 25e9, "latency_s": 1e-6}))
        link = get_link(str(path))
    assert (link.name, link.bandwidth_bytes_per_s, link.source["latency_s"]) == ("ib", 25e9, "file")
    assert link.transfer_us(25_000) == pytest.approx(2.0)


def test_run_devices_errors(capsys, tmp_path):
    out = tmp_path / "o.npz"
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--devices", 2, "--outputs", out)
    one_line_error(code, err, "C backend only", "--backend cpu")
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--link", "nvlink", "--outputs", out)
    one_line_error(code, err, "add --devices")
    code, _, err = run_cli(capsys, "run", sample_path("gelu_chain"), "--backend", "cpu", "--devices", 2,
                           "--cluster", "127.0.0.1:1", "--outputs", out)
    one_line_error(code, err, "cannot reach the Ray cluster at '127.0.0.1:1'")
    assert not out.exists()
