"""WAN benchmark: iteration time of the real runtime over emulated geo-distributed links, per method, next to the
simulator's prediction for the same schedule on the same measured links.

    .venv/bin/python benchmarks/wan/run.py [--peers 20] [--emulate-model 1.5b] [--repeats 3] [--methods ...]

Needs root (network namespaces and tc). For each method (DT-FM full pipeline, random skip, SkipPipe without and
with collision awareness) it starts a fresh local swarm in which every peer is a host of an `EmulatedNetwork`:
the kernel shapes each directed link to the profile's bandwidth (tc htb) and the transport adds the link's
latency. The swarm trains the tiny model but carries a bigger preset's load (`--emulate-model`, default the
paper's 1.5B): every activation and gradient is padded to the bytes that preset sends per microbatch
(`swarm.message_bytes`: dim x tokens per microbatch x 2 bytes, 16 MiB for 1.5b; the planner's cost tables and the
peers' goodput probes use the same size), and every peer takes the time that preset's stage would on the
profile's device (`--emulate-speed`, `peers.emulated_model.stage_time_scale`), so 20 peers fit on 2 cores.
Peers measure their links by probing, as in a real run, and the coordinator plans on those measurements; the
full pipeline gets its own placement (groups sized for its columns, searched on its own simulation). The first
iteration (streams opening) is not counted; the median of the others is compared with the simulation of the
planned schedule on the measured cost tables it carries: the expected makespan over simulations whose messages
deviate as the peers measured theirs deviate during the run (`jitter_ms` of the coordinator's metrics), next to
the on-time simulation and the planner's own prediction. The peers measure a message against its link's recent
median (what planning needs: how much a link varies), which absorbs a steady offset: on a machine whose cores every
send shares, messages take longer the more are in flight. So the same schedule is also simulated with the
deviations of the run's own pipeline messages from the cost table it was planned on (`simulated_table_s`): what
the simulator, told how long the messages really took (as a distribution, not message by message), predicts.
Throughput is reported as tokens/s (of the emulated preset's microbatches) and layer-work/s (tokens x stages
visited: a skip path does less work per token).

Every method runs `--repeats` times (fresh swarms, interleaved), and the summary gives min/median/max of the runs'
median iterations and the ratio of SkipPipe's to the full pipeline's. `--max-runs N` stops after N new runs and
`--resume` continues from --out/results.json, so the runs can be spread over several invocations; `--budget S`
stops a run still going S seconds into the invocation and keeps it if it counted an iteration (for a `timeout`
under a shared lock; results.json says how many iterations each run did).

Writes to --out: results.json, wan.png (bar chart: measured vs simulated per method), trace-<method>-<rep>.json
(Chrome trace of every peer's compute and transfers; open in ui.perfetto.dev) and each run's logs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from benchmarks.wan.footprint import kind_of, swarm_footprint  # noqa: E402
from peers.emulated_model import message_bytes, stage_time_scale  # noqa: E402
from peers.model import FLAVORS  # noqa: E402
from scheduler.costs import CostTables, pooled_jitter  # noqa: E402
from scheduler.expected_makespan import expected_makespan  # noqa: E402
from scheduler.profiles import swarm_from  # noqa: E402
from scheduler.round_trips import schedule_sim_routes  # noqa: E402
from scheduler.simulator import simulate  # noqa: E402
from swarm.cli.plan import load_schedule_with_costs  # noqa: E402
from swarm.local.emulated_network import EmulatedNetwork, unavailable_reason  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402
from swarm.peer.timeline import chrome_trace, read_spans  # noqa: E402
from swarm.run_config import MAX_MESSAGE_BYTES  # noqa: E402

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
heartbeat = {args.heartbeat}  # 12-20 peers on 2 cores: a record refresh can be late, the peer alive
message_bytes = {args.message_bytes}  # each activation and gradient padded to the emulated model's
"""


def wire_message_bytes(args: argparse.Namespace) -> int:
    """Bytes of one activation on the wire: the run's shape padded to `message_bytes` (as `RunConfig` pads it)."""
    row = args.seq_len * FLAVORS["tiny"].dim * 4
    return max(args.batch_size, -(-args.message_bytes // row)) * row


def measure(args: argparse.Namespace, method: str, net: EmulatedNetwork, keys: Path, speeds: list[float],
            out: Path, rep: int = 0) -> dict:
    run_dir = out / f"{method}-{rep}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for key in keys.glob("*.key"):
        shutil.copy(key, run_dir / key.name)
    (run_dir / "run.toml").write_text(run_config(args, method))
    peer_args = [["--emulate-speed", f"{speeds[i]:.6f}", "--emulate-latency", str(keys / f"latency-{i:02d}.json"),
                  "--trace", str(run_dir / f"trace-{i:02d}.jsonl"), *scale_peer_args(args)]
                 for i in range(args.peers)]
    swarm = LocalSwarm(run_dir, args.peers, run_id=f"wan-{method}", network=net,
                       coordinator_args=["--config", str(run_dir / "run.toml")], peer_args=peer_args)
    stagger_starts(swarm, args.stagger)
    start = time.monotonic()
    footprint = None
    try:
        swarm.start()
        records: list[dict] = []
        # one iteration at a time: `watch` restarts its timeout at every record, so the budget is re-cut each time
        for n in range(1, args.iterations + 1):
            try:
                records = swarm.watch(n, timeout=_watch_timeout(args))
            except TimeoutError:
                if not _over_budget(args) or len(records) < 2:
                    raise
                break  # out of time: keep the iterations done (at least one counted)
            if n == 2 and args.footprint:  # mid-run: every peer placed, streams open, messages in flight
                footprint = swarm_footprint([proc.pid for proc in swarm.peers])
    finally:
        swarm.stop()
    if len(records) < args.iterations:
        print(f"  note: {method} run {rep + 1} stopped at the --budget after {len(records)} of {args.iterations} "
              "iterations; its median is of the counted ones", flush=True)
    return run_result(args, method, rep, run_dir, out, net.latency, net.bandwidth, records, footprint,
                      time.monotonic() - start)


def run_result(args: argparse.Namespace, method: str, rep: int, run_dir: Path, out: Path, latency: np.ndarray,
               bandwidth: np.ndarray, records: list[dict], footprint: dict | None, wall: float | None) -> dict:
    """One run's figures from its directory (schedules, traces) and its iteration records; writes its Chrome
    trace to `out`. `latency` and `bandwidth` are the emulated links (host order)."""
    keys = out / "keys"
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
    # the metrics number iterations from 1 as they commit, the traces from 0
    deviations = pooled_jitter(message_deviations(spans, tables, {r["iteration"] - 1 for r in records[1:]}))
    table_sim = expected_makespan(replace(tables, jitter=deviations), routes).mean if deviations is not None else None
    (out / f"trace-{method}-{rep}.json").write_text(json.dumps(chrome_trace(spans, labels)))
    # how well the peers' probes measured the emulated links (the planner's inputs), for this run's message size
    order = [ids.index(p) for p in tables.ids]
    truth = latency[np.ix_(order, order)] + wire_message_bytes(args) / bandwidth[np.ix_(order, order)]
    off = ~np.eye(len(order), dtype=bool)
    link_ratio = float(np.median(tables.message[off] / truth[off]))
    median = statistics.median(times)
    groups = np.bincount(list(schedule.placement.values()), minlength=schedule.num_stages).tolist()
    columns = len({r.peers for r in schedule.routes}) if method == "full-pipeline" else None
    tokens = len(schedule.routes) * args.microbatch_tokens
    layer_work = sum(len(r.stages) + 1 for r in schedule.routes) * args.microbatch_tokens
    result = {"method": method, "rep": rep, "measured_s": times, "iterations_done": len(records),
              "median_s": median, "simulated_s": simulated, "simulated_table_s": table_sim,
              "message_deviation_ms": None if deviations is None else
              [round(1e3 * float(q), 1) for q in np.quantile(deviations, (0.1, 0.5, 0.9, 0.99))],
              "on_time_s": on_time, "planned_s": schedule.predicted_iteration_seconds,
              "planned_jitter_ms": [round(1e3 * j, 2) for j in (tables.jitter if tables.jitter is not None else [])],
              "run_jitter_ms": run_jitter, "simulated_p90_s": expected.p90, "microbatches": len(schedule.routes),
              "stages_per_path": sorted({len(r.stages) + 1 for r in schedule.routes}),
              "stage_groups": groups, "columns": columns, "peers_used": len({p for r in schedule.routes
                                                                            for p in (r.origin, *r.peers)}),
              "tokens_per_s": tokens / median, "layer_work_per_s": layer_work / median,
              "measured_over_emulated_message_time": round(link_ratio, 3),
              "footprint": footprint, "wall_s": None if wall is None else round(wall, 1)}
    each = ", ".join(f"{t:.2f}" for t in times)
    print(f"{LABELS[method]:>22} (run {rep + 1}): measured median {median:.2f} s (iterations {each}), "
          f"simulated {simulated:.2f} s with the run's jitter (on time {on_time:.2f}, planned "
          f"{schedule.predicted_iteration_seconds or float('nan'):.2f}), measured/simulated "
          f"{median / simulated:.2f} (on time {median / on_time:.2f}"
          + (f", with the messages' deviation from the table {median / table_sim:.2f}" if table_sim else "")
          + f"); {result['tokens_per_s']:.0f} tokens/s, "
          f"{result['layer_work_per_s']:.0f} layer-tokens/s; groups {groups}"
          f"{f', {columns} columns' if columns else ''}; link model/emulated links {link_ratio:.2f}", flush=True)
    return result


def message_deviations(spans: list[dict], tables: CostTables, iterations: set[int]) -> list[float]:
    """Seconds each pipeline message of `iterations` took beyond its link's time in `tables` (the sender's span,
    which ends at the receiver's answer, less `tables.message` of that link)."""
    index = {p: i for i, p in enumerate(tables.ids)}
    return [float(s["end"] - s["start"] - tables.message[index[s["peer"]], index[s["to"]]]) for s in spans
            if s["kind"] in ("send_forward", "send_backward") and s.get("iteration") in iterations
            and s["peer"] in index and s.get("to") in index]


def _watch_timeout(args: argparse.Namespace) -> float:
    """Seconds to wait for the next iteration: the stall timeout, cut to what is left of the --budget."""
    if not args.budget:
        return args.stall_timeout
    return max(1.0, min(args.stall_timeout, args.budget_deadline - time.monotonic()))


def _over_budget(args: argparse.Namespace) -> bool:
    return bool(args.budget) and time.monotonic() >= args.budget_deadline - 1.0


def spread(values: list[float]) -> dict:
    """min / median / max of `values`."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def summarize(results: list[dict]) -> dict:
    """Per method, min/median/max over its runs of the run's median iteration, throughput and fidelity; and the
    ratio of SkipPipe's iteration to the full pipeline's (of the medians, and per repetition where both ran)."""
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["method"], []).append(r)
    summary: dict = {"methods": {}}
    for method, runs in by.items():
        summary["methods"][method] = {
            "runs": len(runs), "iteration_s": spread([r["median_s"] for r in runs]),
            "simulated_s": spread([r["simulated_s"] for r in runs]),
            "measured_over_simulated": spread([r["median_s"] / r["simulated_s"] for r in runs]),
            "measured_over_simulated_table": spread([r["median_s"] / r["simulated_table_s"] for r in runs
                                                     if r.get("simulated_table_s")] or [float("nan")]),
            "tokens_per_s": spread([r["tokens_per_s"] for r in runs]),
            "layer_work_per_s": spread([r["layer_work_per_s"] for r in runs])}
    if "skippipe" in by and "full-pipeline" in by:
        med = {m: summary["methods"][m]["iteration_s"]["median"] for m in ("skippipe", "full-pipeline")}
        full = {r["rep"]: r for r in by["full-pipeline"]}
        paired = [r["median_s"] / full[r["rep"]]["median_s"] for r in by["skippipe"] if r["rep"] in full]
        summary["skippipe_over_full_pipeline"] = {"of_medians": med["skippipe"] / med["full-pipeline"],
                                                  "per_repetition": spread(paired) if paired else None}
    return summary


def report(summary: dict) -> None:
    for method, m in summary["methods"].items():
        it, sim, ratio = m["iteration_s"], m["simulated_s"], m["measured_over_simulated"]
        print(f"{LABELS[method]:>22}, {m['runs']} runs: iteration {it['min']:.2f} / {it['median']:.2f} / "
              f"{it['max']:.2f} s (min/median/max), simulated {sim['median']:.2f} s, measured/simulated "
              f"{ratio['min']:.2f} / {ratio['median']:.2f} / {ratio['max']:.2f} (with the messages' deviation from "
              f"the table {m['measured_over_simulated_table']['median']:.2f}); tokens/s "
              f"{m['tokens_per_s']['median']:.0f}, layer-tokens/s {m['layer_work_per_s']['median']:.0f}", flush=True)
    ratio = summary.get("skippipe_over_full_pipeline")
    if ratio:
        rep = ratio["per_repetition"]
        print(f"SkipPipe / full pipeline, measured: {ratio['of_medians']:.2f}x of the medians"
              + (f" (per repetition {rep['min']:.2f} / {rep['median']:.2f} / {rep['max']:.2f})" if rep else "")
              + "; target <= 0.5x", flush=True)


def chart(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in METHODS if any(r["method"] == m for r in results)]
    runs = {m: [r for r in results if r["method"] == m] for m in methods}
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(methods))
    med = [statistics.median(r["median_s"] for r in runs[m]) for m in methods]
    lo = [med[i] - min(r["median_s"] for r in runs[m]) for i, m in enumerate(methods)]
    hi = [max(r["median_s"] for r in runs[m]) - med[i] for i, m in enumerate(methods)]
    ax.bar(x - 0.27, med, 0.27, yerr=[lo, hi], capsize=3, label="measured (median of runs, min-max)",
           color="#3b75af")
    ax.bar(x, [statistics.median(r["simulated_s"] for r in runs[m]) for m in methods], 0.27,
           label="simulated, measured jitter", color="#f0a04b")
    ax.bar(x + 0.27, [statistics.median(r["on_time_s"] for r in runs[m]) for m in methods], 0.27,
           label="simulated, on time", color="#f6d3a5")
    ax.set_xticks(x, [LABELS[m] for m in methods])
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
    parser.add_argument("--emulate-model", default="none",
                        help=f"carry this preset's messages and take its compute time ({', '.join(FLAVORS)}; "
                             "none = the tiny model's own messages, compute at the profile's seconds per layer)")
    parser.add_argument("--microbatch-tokens", type=int, default=None,
                        help="tokens per microbatch of the emulated preset (default: one sequence of its context)")
    parser.add_argument("--activation-bytes", type=int, default=None,
                        help="bytes of each activation and gradient (default: the emulated preset's)")


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that let 20 or more peer trees start and run on a small loaded machine, shared by the WAN
    benchmarks (check them with `check_scale_arguments`)."""
    parser.add_argument("--stagger", type=float, default=2.0,
                        help="seconds from a peer's gossip sidecar being up to the next peer's start (a peer tree "
                             "takes ~10 CPU-s to start: 20 at once on 2 loaded cores miss their start deadlines)")
    parser.add_argument("--join-timeout", type=float, default=480.0,
                        help="seconds a peer waits to be placed (the coordinator plans once every peer has joined "
                             "and probed its links: minutes for 20 peers starting on 2 loaded cores)")
    parser.add_argument("--heartbeat", type=float, default=15.0,
                        help="swarm.heartbeat: 20 peer trees load 2 cores so that DHT stores time out for tens of "
                             "seconds; at 5 s the coordinator's record expired and peers took over as scheduler")
    parser.add_argument("--probe-sample", type=int, default=0,
                        help="peers a joiner probes before it announces itself, and per background round after "
                             "(0 = all others: every link measured before the first plan, but joins are sequential "
                             "16 MiB probes, minutes for the last of 20 peers)")


def check_scale_arguments(args: argparse.Namespace) -> None:
    """Exit with a message when a flag of `add_scale_arguments` is out of range."""
    if not 0 <= args.probe_sample < args.peers or not 0.2 <= args.heartbeat <= 60 or not args.stagger >= 0 or \
            not args.join_timeout > 0:
        sys.exit("error: --probe-sample must be in [0, peers), --heartbeat in [0.2, 60], --stagger >= 0, "
                 "--join-timeout > 0")


def scale_peer_args(args: argparse.Namespace) -> list[str]:
    """Every peer's flags that `add_scale_arguments` sets."""
    return ["--probe-sample", str(args.probe_sample or args.peers - 1), "--join-timeout", str(args.join_timeout)]


HELPERS_WAIT = 120.0
"""Seconds at most that a peer's start waits for the previous peer's gossip sidecar to be up."""


def stagger_starts(swarm: LocalSwarm, seconds: float) -> None:
    """Make `swarm` start each peer, joiners included, `seconds` after the previous one's gossip sidecar is up (at
    most HELPERS_WAIT after its start): a peer tree's start is ~10 CPU-s, and 40 of them at a fixed pace on 2 cores
    overloaded the machine (load average 70) until p2p daemons missed their start deadlines and peers exited."""
    add_peer = swarm.add_peer
    previous: list[subprocess.Popen] = []

    def staggered(index: int, extra: Sequence[str] = ()) -> subprocess.Popen:
        if previous:
            helpers_up(previous[-1], HELPERS_WAIT)
        time.sleep(seconds)
        proc = add_peer(index, extra)
        previous.append(proc)
        return proc

    swarm.add_peer = staggered  # type: ignore[method-assign]


def helpers_up(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until `proc`'s tree has its gossip sidecar (started after its DHT and p2pd), it exits, or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
            if any(kind_of(p, proc.pid) == "gossip sidecar" for p in tree):
                return True
        except psutil.Error:
            pass  # a process of the tree exited while it was read
        time.sleep(0.5)
    return False


def emulation(args: argparse.Namespace) -> float:
    """Fill in `args.message_bytes` and `args.microbatch_tokens` from the emulation flags; return the factor on
    the profile's seconds per layer that makes one tiny stage take as long as one of the emulated preset's.
    Exits with a message on a bad value."""
    tiny_layers_per_stage = FLAVORS["tiny"].n_layers / args.stages
    try:
        if args.emulate_model == "none":
            args.microbatch_tokens = args.microbatch_tokens or args.batch_size * args.seq_len
            scale = 1.0
            default_bytes = 0
        else:
            scale = stage_time_scale(args.emulate_model, args.stages, args.microbatch_tokens) / tiny_layers_per_stage
            default_bytes = message_bytes(args.emulate_model, args.microbatch_tokens)
            args.microbatch_tokens = args.microbatch_tokens or FLAVORS[args.emulate_model].max_seq_len
    except ValueError as e:
        sys.exit(f"error: --emulate-model/--microbatch-tokens: {e}")
    if args.activation_bytes is not None and not 0 <= args.activation_bytes <= MAX_MESSAGE_BYTES:
        sys.exit(f"error: --activation-bytes must be in [0, {MAX_MESSAGE_BYTES}], got {args.activation_bytes}")
    args.message_bytes = default_bytes if args.activation_bytes is None else args.activation_bytes
    return scale


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


SAME_RUN = ("peers", "stages", "skip", "microbatches", "batch_size", "seq_len", "profile", "seed", "iterations",
            "compute_scale", "emulate_model", "microbatch_tokens", "message_bytes", "heartbeat", "probe_sample")
"""Arguments that must match for --resume to add runs to an earlier results.json."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_swarm_arguments(parser, METHODS)
    parser.set_defaults(peers=20, emulate_model="1.5b")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--compute-scale", type=float, default=1.0,
                        help="multiply the emulated device's seconds per layer")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each method (fresh swarms, interleaved)")
    parser.add_argument("--max-runs", type=int, default=0, help="stop after this many new runs (0 = all)")
    parser.add_argument("--resume", action="store_true", help="add to --out/results.json's runs of the same setting")
    parser.add_argument("--footprint", action=argparse.BooleanOptionalAction, default=True,
                        help="measure each peer tree's PSS once per run, after its second iteration")
    parser.add_argument("--stall-timeout", type=float, default=600.0, help="seconds without a committed iteration")
    add_scale_arguments(parser)
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds this invocation may take (0 = no limit): a run still going then is stopped and "
                             "kept if it counted an iteration (iterations_done in results.json); none starts after")
    parser.add_argument("--recover", default=None, metavar="METHOD-REP",
                        help="add the result of a run that was stopped after its swarm but before its figures (e.g. "
                             "by `timeout`), from --out/METHOD-REP's metrics, schedules and traces; runs no swarm")
    parser.add_argument("--gib-per-peer", type=float, default=0.7,
                        help="refuse to start a swarm unless this much memory per peer is available (0 = no check)")
    parser.add_argument("--out", default="runs/wan")
    args = parser.parse_args()
    args.budget_deadline = time.monotonic() + args.budget
    unwind_on_sigterm()  # `timeout` (or a kill): the swarm is stopped and the namespaces deleted
    if args.repeats < 1 or args.iterations < 2:
        sys.exit("error: --repeats must be >= 1 and --iterations >= 2 (the first is not counted)")
    check_scale_arguments(args)
    if not args.budget >= 0:
        sys.exit("error: --budget must be >= 0")
    methods = checked_methods(args, METHODS)
    scale = emulation(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    if args.resume and (out / "results.json").exists():
        earlier = json.loads((out / "results.json").read_text())
        differ = [k for k in SAME_RUN if earlier["args"].get(k) != vars(args).get(k)]
        if differ:
            sys.exit(f"error: --resume: {out / 'results.json'} was run with other {', '.join(differ)}")
        results = earlier["results"]
    view = swarm_from(args.profile, args.peers, seed=args.seed)
    if args.recover:
        if not args.resume:
            sys.exit("error: --recover adds to an earlier results.json: give --resume too")
        recover(args, out, view.latency, view.bandwidth, results)
        return
    speeds = [p.seconds_per_layer * args.compute_scale * scale for p in view.peers]
    keys = out / "keys"
    keys.mkdir(exist_ok=True)
    ids = [ensure_identity(str(keys / f"peer-{i:02d}.key")) for i in range(args.peers)]
    emulated = "the tiny model's own" if args.emulate_model == "none" else f"{args.emulate_model}'s"
    print(f"{args.peers} peers on the {args.profile} profile ({args.stages} stages, skip {args.skip}, "
          f"{args.microbatches} microbatches per data holder); {emulated} messages "
          f"({wire_message_bytes(args) / 2**20:.2f} MiB each) and compute "
          f"({min(speeds):.3f}-{max(speeds):.3f} s per tiny layer); links shaped by tc htb, latency added by the "
          f"transport; {args.repeats} runs per method", flush=True)
    todo = [(rep, m) for rep in range(args.repeats) for m in methods
            if not any(r["method"] == m and r["rep"] == rep for r in results)]
    if args.max_runs:
        todo = todo[: args.max_runs]
    with EmulatedNetwork(view.latency, view.bandwidth) as net:
        for i in range(args.peers):
            net.write_latency_file(i, ids, keys / f"latency-{i:02d}.json")
        for rep, method in todo:
            if _over_budget(args):
                print(f"out of --budget: not starting {method} run {rep + 1}", flush=True)
                break
            free = psutil.virtual_memory().available / 2**30
            if free < args.gib_per_peer * args.peers:
                sys.exit(f"error: {free:.1f} GiB of memory available, {args.peers} peers need about "
                         f"{args.gib_per_peer * args.peers:.0f} (--gib-per-peer); not starting {method} run {rep + 1}")
            results.append(measure(args, method, net, keys, speeds, out, rep))
            write_results(out, args, results)
    summary = write_results(out, args, results)
    report(summary)
    chart(results, out / "wan.png", f"{args.peers} peers, {args.profile}, {args.stages} stages, skip {args.skip}, "
                                    f"{emulated} messages: one iteration on the runtime vs the simulator")
    print(f"wrote {out / 'results.json'}, {out / 'wan.png'} and trace-<method>-<run>.json (open in ui.perfetto.dev)")


def recover(args: argparse.Namespace, out: Path, latency: np.ndarray, bandwidth: np.ndarray,
            results: list[dict]) -> None:
    """Add the run in --out/<--recover> to `results` from what it left (no footprint: it was measured live)."""
    method, _, rep = args.recover.rpartition("-")
    run_dir = out / args.recover
    if method not in METHODS or not rep.isdigit() or not (run_dir / "metrics.jsonl").is_file():
        sys.exit(f"error: --recover {args.recover!r}: want METHOD-REP with {run_dir}/metrics.jsonl")
    if any(r["method"] == method and r["rep"] == int(rep) for r in results):
        sys.exit(f"error: --recover: {args.recover} is in results.json already")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if len(records) < 2:
        sys.exit(f"error: --recover: {args.recover} has {len(records)} iteration(s), none counted")
    records = records[: args.iterations]
    result = run_result(args, method, int(rep), run_dir, out, latency, bandwidth, records, None, None)
    result["recovered"] = True
    results.append(result)
    report(write_results(out, args, results))


def write_results(out: Path, args: argparse.Namespace, results: list[dict]) -> dict:
    summary = summarize(results)
    (out / "results.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                  "args": vars(args), "summary": summary, "results": results},
                                                 indent=1))
    return summary


if __name__ == "__main__":
    main()
