"""WAN benchmark: iteration time of the real runtime over emulated geo-distributed links, per method, next to the
simulator's prediction for the same schedule on the same measured links.

    sudo .venv/bin/python benchmarks/wan/run.py [--peers 12] [--stages 6] [--skip 0.33] [--iterations 6]

Needs root (network namespaces and tc). For each method (DT-FM full pipeline, random skip, SkipPipe without and
with collision awareness) it starts a fresh local swarm in which every peer is a host of an `EmulatedNetwork`:
the kernel shapes each directed link to the profile's bandwidth (tc htb) and the transport adds the link's
latency; every peer emulates the profile's compute speed (`--emulate-speed`: operations padded to it, so 12-20
peers fit on 2 cores). Peers measure their links by probing, as in a real run, and the coordinator plans on
those measurements. The first iteration (streams opening) is not counted; the median of the others is compared
with the simulation of the planned schedule on the measured cost tables it carries: the expected makespan over
simulations whose messages deviate as the peers measured theirs deviate during the run (`jitter_ms` of the
coordinator's metrics), next to the on-time simulation and the planner's own prediction.

Writes to --out: results.json, wan.png (bar chart: measured vs simulated per method), trace-<method>.json
(Chrome trace of every peer's compute and transfers; open in ui.perfetto.dev) and each run's logs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from peers.model import FLAVORS  # noqa: E402
from scheduler.expected_makespan import expected_makespan  # noqa: E402
from scheduler.profiles import swarm_from  # noqa: E402
from scheduler.round_trips import schedule_sim_routes  # noqa: E402
from scheduler.simulator import simulate  # noqa: E402
from swarm.cli.plan import load_schedule_with_costs  # noqa: E402
from swarm.local.emulated_network import EmulatedNetwork, unavailable_reason  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402
from swarm.peer.timeline import chrome_trace, read_spans  # noqa: E402

METHODS = ("full-pipeline", "random-skip", "skippipe-no-collision", "skippipe")
LABELS = {"full-pipeline": "DT-FM full pipeline", "random-skip": "random skip",
          "skippipe-no-collision": "SkipPipe, no TC2", "skippipe": "SkipPipe"}


def run_config(args: argparse.Namespace, method: str) -> str:
    return f"""
[run]
run_id = "wan-{method}"
model = "tiny"
stages = {args.stages}
skip = {args.skip}  # the same placement and work for every method; `planner` picks the paths
microbatches = {args.microbatches}
iterations = {args.iterations}
min_peers = {args.peers}
seed = {args.seed}

[data]
seq_len = {args.seq_len}
batch_size = {args.batch_size}

[swarm]
planner = "{method}"
heartbeat = 5.0  # 12-20 peers on 2 cores: a record refresh can be late without the peer being gone
"""


def measure(args: argparse.Namespace, method: str, net: EmulatedNetwork, keys: Path, speeds: list[float],
            out: Path) -> dict:
    run_dir = out / method
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for key in keys.glob("*.key"):
        shutil.copy(key, run_dir / key.name)
    (run_dir / "run.toml").write_text(run_config(args, method))
    peer_args = [["--emulate-speed", f"{speeds[i]:.6f}", "--emulate-latency", str(keys / f"latency-{i:02d}.json"),
                  "--trace", str(run_dir / f"trace-{i:02d}.jsonl"), "--probe-sample", str(args.peers - 1)]
                 for i in range(args.peers)]
    swarm = LocalSwarm(run_dir, args.peers, run_id=f"wan-{method}", network=net,
                       coordinator_args=["--config", str(run_dir / "run.toml")], peer_args=peer_args)
    start = time.monotonic()
    try:
        swarm.start()
        records = swarm.watch(args.iterations, timeout=600)
    finally:
        swarm.stop()
    times = [r["iteration_seconds"] for r in records[1:]]
    newest = max(run_dir.glob("schedule-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    if newest.stem != "schedule-0":
        print(f"  note: {method} was re-planned ({newest.stem}); the last epoch is simulated", flush=True)
    schedule, tables = load_schedule_with_costs(str(newest))
    routes = schedule_sim_routes(schedule, tables)
    on_time = simulate(tables, routes).makespan
    # the jitter the scheduled peers measured on their pipeline messages during the run, as the coordinator
    # logged it (the schedule's tables carry what they had measured when it was planned: mostly probes)
    run_jitter = next((r["jitter_ms"] for r in reversed(records) if r.get("jitter_ms")), None)
    expected = expected_makespan(replace(tables, jitter=np.array(run_jitter) / 1e3) if run_jitter else tables,
                                 routes)
    simulated = expected.mean
    ids = [ensure_identity(str(keys / f"peer-{i:02d}.key")) for i in range(args.peers)]
    labels = {p: f"peer-{i:02d} stage {schedule.placement.get(p, '-')}" for i, p in enumerate(ids)}
    spans = read_spans(run_dir.glob("trace-*.jsonl"))
    (out / f"trace-{method}.json").write_text(json.dumps(chrome_trace(spans, labels)))
    # how well the peers' probes measured the emulated links (the planner's inputs)
    order = [ids.index(p) for p in tables.ids]
    activation = args.batch_size * args.seq_len * FLAVORS["tiny"].dim * 4  # one float32 message
    truth = net.latency[np.ix_(order, order)] + activation / net.bandwidth[np.ix_(order, order)]
    off = ~np.eye(len(order), dtype=bool)
    link_ratio = float(np.median(tables.message[off] / truth[off]))
    result = {"method": method, "measured_s": times, "median_s": statistics.median(times), "simulated_s": simulated,
              "on_time_s": on_time, "planned_s": schedule.predicted_iteration_seconds,
              "planned_jitter_ms": [round(1e3 * j, 2) for j in (tables.jitter if tables.jitter is not None else [])],
              "run_jitter_ms": run_jitter, "simulated_p90_s": expected.p90, "microbatches": len(schedule.routes),
              "stages_per_path": sorted({len(r.stages) + 1 for r in schedule.routes}),
              "measured_over_emulated_message_time": round(link_ratio, 3),
              "wall_s": round(time.monotonic() - start, 1)}
    each = ", ".join(f"{t:.2f}" for t in times)
    print(f"{LABELS[method]:>22}: measured median {result['median_s']:.2f} s (iterations {each}), "
          f"simulated {simulated:.2f} s with the run's jitter (on time {on_time:.2f}, planned "
          f"{schedule.predicted_iteration_seconds or float('nan'):.2f}), measured/simulated "
          f"{result['median_s'] / simulated:.2f} (on time {result['median_s'] / on_time:.2f}); "
          f"link model/emulated links {link_ratio:.2f}", flush=True)
    return result


def chart(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(results))
    med = [r["median_s"] for r in results]
    lo = [r["median_s"] - min(r["measured_s"]) for r in results]
    hi = [max(r["measured_s"]) - r["median_s"] for r in results]
    ax.bar(x - 0.27, med, 0.27, yerr=[lo, hi], capsize=3, label="measured (median, min-max)", color="#3b75af")
    ax.bar(x, [r["simulated_s"] for r in results], 0.27, label="simulated, measured jitter", color="#f0a04b")
    ax.bar(x + 0.27, [r["on_time_s"] for r in results], 0.27, label="simulated, on time", color="#f6d3a5")
    ax.set_xticks(x, [LABELS[r["method"]] for r in results])
    ax.set_ylabel("iteration time (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_swarm_arguments(parser: argparse.ArgumentParser, methods: tuple[str, ...]) -> None:
    """The emulated swarm's flags, shared by the WAN benchmarks."""
    parser.add_argument("--peers", type=int, default=12)
    parser.add_argument("--stages", type=int, default=6)
    parser.add_argument("--skip", type=float, default=0.33)
    parser.add_argument("--microbatches", type=int, default=4, help="per data holder per iteration")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per microbatch")
    parser.add_argument("--seq-len", type=int, default=32,
                        help="tokens per sequence (small: the real compute must stay under the emulated times)")
    parser.add_argument("--profile", default="geo-distributed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default=",".join(methods))


def checked_methods(args: argparse.Namespace, methods: tuple[str, ...]) -> list[str]:
    """The requested methods; exits with a message when this machine cannot emulate links or a method is unknown."""
    reason = unavailable_reason()
    if reason:
        sys.exit(f"error: {reason}")
    chosen = [m for m in args.methods.split(",") if m]
    unknown = set(chosen) - set(methods)
    if unknown:
        sys.exit(f"error: unknown method(s) {sorted(unknown)}; choose from {', '.join(methods)}")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_swarm_arguments(parser, METHODS)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--compute-scale", type=float, default=1.0,
                        help="multiply the profile's seconds per layer (the emulated device speed)")
    parser.add_argument("--out", default="runs/wan")
    args = parser.parse_args()
    methods = checked_methods(args, METHODS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    view = swarm_from(args.profile, args.peers, seed=args.seed)
    speeds = [p.seconds_per_layer * args.compute_scale for p in view.peers]
    keys = out / "keys"
    keys.mkdir(exist_ok=True)
    ids = [ensure_identity(str(keys / f"peer-{i:02d}.key")) for i in range(args.peers)]
    print(f"{args.peers} peers on the {args.profile} profile ({args.stages} stages, skip {args.skip}, "
          f"{args.microbatches} microbatches per data holder); compute emulated at "
          f"{min(speeds):.3f}-{max(speeds):.3f} s/layer; links shaped by tc htb, latency added by the transport",
          flush=True)
    results = []
    with EmulatedNetwork(view.latency, view.bandwidth) as net:
        for i in range(args.peers):
            net.write_latency_file(i, ids, keys / f"latency-{i:02d}.json")
        for method in methods:
            results.append(measure(args, method, net, keys, speeds, out))
    by = {r["method"]: r for r in results}
    summary = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "results": results}
    if "skippipe" in by and "full-pipeline" in by:
        summary["skippipe_over_full_pipeline"] = by["skippipe"]["median_s"] / by["full-pipeline"]["median_s"]
        print(f"SkipPipe / full pipeline, measured: {summary['skippipe_over_full_pipeline']:.2f}x "
              f"(simulated {by['skippipe']['simulated_s'] / by['full-pipeline']['simulated_s']:.2f}x; target <= 0.5x)")
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    chart(results, out / "wan.png", f"{args.peers} peers, {args.profile}, {args.stages} stages, skip {args.skip}: "
                                    "one iteration on the runtime vs the simulator")
    print(f"wrote {out / 'results.json'}, {out / 'wan.png'} and trace-<method>.json (open in ui.perfetto.dev)")


if __name__ == "__main__":
    main()
