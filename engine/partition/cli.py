"""`tileweave partition MODEL --devices N`: a planned model split across N devices (pipeline stages,
tensor-parallel contractions), printed as per-device stages, memory peaks and the transfer plan."""

from __future__ import annotations

import argparse
import json

from engine.partition.links import DEFAULT_LINK, LINKS


def add_link_args(p: argparse.ArgumentParser, *, devices_required: bool) -> None:
    """--devices N and --link L (what `partition` and `run --devices` take)."""
    p.add_argument("--devices", type=int, required=devices_required, default=None if devices_required else 1,
                   metavar="N", help="number of devices (copies of --device) to split the model across"
                   + ("" if devices_required else " (default 1: no partition)"))
    p.add_argument("--link", default=DEFAULT_LINK, metavar="|".join(LINKS) + "|FILE.json",
                   help=f"link between every two devices: a preset ({', '.join(f'{k} {v.description}' for k, v in LINKS.items())}) "
                        f"or a JSON file {{\"bandwidth_bytes_per_s\": .., \"latency_s\": ..}} (default {DEFAULT_LINK})")


def add_partition_command(sub) -> None:
    from engine.commands import add_plan_args

    p = sub.add_parser(
        "partition", help="split a model across N devices and plan the transfers (Wolong)",
        description="Plan MODEL for --device, then cut its kernels into N pipeline stages (stage d on device d) "
                    "by dynamic programming, each within the device's memory_bytes (weights resident + "
                    "activation peak); a contraction whose weight takes over half a device, or whose kernel "
                    "takes over 1/N of the modeled time, is also tried split along its output axis over all "
                    "devices (tensor parallel), and the cut with the lower modeled makespan of one request "
                    "is kept. Prints each device's kernels, weights and memory peak, the transfer plan "
                    "(tensor, from, to, bytes, modeled µs at the link's bandwidth and latency), the makespan "
                    "beside one device's, and the period of a stream of requests.")
    add_plan_args(p, "fusion policy")
    add_link_args(p, devices_required=True)
    p.add_argument("--trace", metavar="OUT.json",
                   help="write the modeled timeline as a Chrome trace (one process per device, one for the links)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_partition)


def partitioned_model(args: argparse.Namespace):
    """(device, graph, plan, partition) for the `partition`/`run --devices` arguments; the graph and plan
    are the partitioned ones (tensor-parallel splits applied)."""
    from engine.commands import planned_model
    from engine.partition.links import get_link
    from engine.partition.plan import check_devices, partition_model

    check_devices(args.devices)
    link = get_link(args.link)  # bad --link: one line before any planning
    device, graph, plan = planned_model(args)
    graph, plan, part = partition_model(graph, plan, device, args.devices, link)
    return device, graph, plan, part


def cmd_partition(args: argparse.Namespace) -> int:
    from engine.files import check_output
    from engine.rprogram.trace import export_partition_trace, write_trace

    if args.trace:
        check_output(args.trace, "--trace", inputs=(args.model, args.plan_in), kind="json")
    _, _, _, part = partitioned_model(args)
    if args.trace:
        write_trace([], args.trace, trace=export_partition_trace(part))
    print(json.dumps(part.to_json(), indent=1) if args.json else format_partition(part))
    return 0


def format_partition(part) -> str:
    link = part.link
    fits = "fits" if part.single_device_fits else "does NOT fit"
    lines = [
        f"partition {part.model_name} · {part.policy} on {part.devices} × {part.device} "
        f"({part.budget_bytes:,} B each) over {link.name} ({link.bandwidth_bytes_per_s / 1e9:g} GB/s "
        f"[{link.source.get('bandwidth_bytes_per_s', '?')}], {link.latency_s * 1e6:g} µs [{link.source.get('latency_s', '?')}])",
        f"makespan      {part.makespan_us:10.2f} µs  (one request, modeled)",
        f"one device    {part.single_device_us:10.2f} µs  (peak {part.single_device_peak_bytes:,} B: {fits})",
        f"period        {part.period_us:10.2f} µs  (a stream of requests: the busiest device or link)",
        "",
        f"{'device':>6}  {'kernels':>7}  {'weights B':>12}  {'peak B':>12}  {'busy µs':>9}  kernels",
    ]
    for s in part.stages:
        lines.append(f"{s.device:>6}  {len(s.kernels):>7}  {s.weight_bytes:>12,}  {s.peak_bytes:>12,}  "
                     f"{s.busy_us:>9.2f}  {', '.join(s.kernels)}")
    lines += ["", f"transfers: {len(part.transfers)}, {part.transfer_bytes:,} B"]
    if part.transfers:
        lines.append(f"{'from':>4}  {'to':>3}  {'bytes':>10}  {'µs':>8}  tensor")
        lines += [f"{t.src:>4}  {t.dst:>3}  {t.bytes:>10,}  {t.us:>8.2f}  {t.tensor}" for t in part.transfers]
    lines += ["", *(f"decision  {d}" for d in part.decisions)]
    return "\n".join(lines)
