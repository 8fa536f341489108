"""WAN churn benchmark: training throughput over emulated geo-distributed links under a seeded churn trace,
against the same run without churn, for SkipPipe, the full pipeline and the SWARM-style baseline.

    sudo .venv/bin/python benchmarks/wan/churn.py [--peers 20] [--emulate-model 1.5b] [--minutes 5] [--rate 0.1]

The swarm of `benchmarks/wan/run.py` (every peer a host of an `EmulatedNetwork`, links shaped to the profile,
compute emulated) with the churn trace of `benchmarks/churn.py`: after the first committed iteration, a window of
`--minutes` starts; in the churn runs a random live peer dies at each failure time (in turn, `--deaths`: kill -9
of its process tree, a machine dying loudly, or SIGSTOP of it, a host dying silently), and a new volunteer joins
`--rejoin` seconds later on a spare host of the network (its links and speed are the profile's for that host).
Throughput is the tokens of the iterations committed within the window over its length; the data holders'
ledgers must show every sample handed out processed exactly once.
The churn run starts from the plan its churn-free run drew (`--first-schedule`; later epochs are its own
re-plans): each run plans on the links it measures, and the full pipeline's churn-free throughput ranged over
118-148 tokens/s from run to run here (its tuned column), more than the churn costs it. `planned_s` is the mean
planned iteration time of the window's iterations, to tell a plan's drift from the churn's cost.

20 peers and the paper's 1.5B messages and compute by default, as in `run.py`, with its flags for a small machine
(`--stagger`, `--join-timeout`, `--heartbeat`, `--probe-sample`). The full pipeline gets its own placement (groups
sized for its columns), so the peer count does not decide its columns. A joiner is staggered like the first
peers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.churn import DEATHS, churn_trace, first_plan, kept, run_swarm, saved_plan_args, window_summary  # noqa: E402
from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from benchmarks.wan.run import (  # noqa: E402
    add_scale_arguments,
    add_swarm_arguments,
    check_scale_arguments,
    checked_methods,
    emulation,
    run_config,
    scale_peer_args,
    stagger_starts,
)
from scheduler.profiles import swarm_from  # noqa: E402
from swarm.local.emulated_network import EmulatedNetwork  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

METHODS = ("skippipe", "full-pipeline", "swarm")


def run(args: argparse.Namespace, method: str, churn: bool, net: EmulatedNetwork, keys: Path, speeds: list[float],
        out: Path, first_schedule: Path | None = None) -> dict:
    run_dir = out / f"{method}-{'churn' if churn else 'steady'}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for key in keys.glob("*.key"):
        shutil.copy(key, run_dir / key.name)
    (run_dir / "run.toml").write_text(run_config(argparse.Namespace(**{**vars(args), "iterations": 0}), method))

    def peer_args(i: int) -> list[str]:
        return ["--emulate-speed", f"{speeds[i]:.6f}", "--emulate-latency", str(keys / f"latency-{i:02d}.json"),
                *scale_peer_args(args), "--iteration-deadline", "300",
                "--ledger", str(run_dir / f"ledger-{i:02d}.jsonl")]

    swarm = LocalSwarm(run_dir, args.peers, run_id=f"wan-{method}", network=net,
                       coordinator_args=["--config", str(run_dir / "run.toml"), *saved_plan_args(first_schedule)],
                       peer_args=[peer_args(i) for i in range(net.num_hosts)])
    stagger_starts(swarm, args.stagger)
    window = args.minutes * 60
    failures = churn_trace(args.seed, args.peers, window, args.rate) if churn else []
    # the first iteration opens streams: the window starts after it
    played, records = run_swarm(swarm, failures, window, args.rejoin, args.seed, lambda index: [],
                                tuple(args.deaths.split(",")), warmup=2, start_timeout=600)
    result = {"method": method, "churn": churn, **window_summary(run_dir, records, played.start, window),
              "died": dict(played.died), "joined": played.joined}
    print(f"  {method} {'with' if churn else 'without'} churn: {result['tokens_per_s']:.0f} tokens/s, "
          f"{result['iterations']} iterations in the window (planned {result['planned_s'] or float('nan'):.2f} s "
          f"each), {result['died']} died, {played.joined} joined, "
          f"{result['epochs']} epochs, samples processed (times: count) {result['samples_processed_times']}",
          flush=True)
    return result


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_swarm_arguments(parser, METHODS)
    parser.set_defaults(peers=20, emulate_model="1.5b")  # see the module docstring
    add_scale_arguments(parser)
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the measured window")
    parser.add_argument("--rate", type=float, default=0.1, help="failures per peer per minute")
    parser.add_argument("--rejoin", type=float, default=20.0, help="seconds until a dead peer is replaced")
    parser.add_argument("--deaths", default="kill,freeze", help=f"kinds of death, in turn ({', '.join(DEATHS)})")
    parser.add_argument("--out", default="runs/wan-churn")
    args = parser.parse_args()
    check_scale_arguments(args)
    methods = checked_methods(args, METHODS)
    scale = emulation(args)  # --emulate-model: a bigger preset's messages and compute (default: none)
    trace = churn_trace(args.seed, args.peers, args.minutes * 60, args.rate)
    hosts = args.peers + len(trace)  # a spare host for every volunteer that joins
    out = Path(args.out)
    keys = out / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    view = swarm_from(args.profile, hosts, seed=args.seed)
    speeds = [p.seconds_per_layer * scale for p in view.peers]
    ids = [ensure_identity(str(keys / f"peer-{i:02d}.key")) for i in range(hosts)]
    print(f"{args.peers} peers on the {args.profile} profile ({args.stages} stages), {args.minutes:g} min window; "
          f"churn trace (seed {args.seed}): failures at {', '.join(f'{t:.0f}' for t in trace)} s, each replaced "
          f"{args.rejoin:g} s later", flush=True)
    results = []
    with EmulatedNetwork(view.latency, view.bandwidth) as net:
        for i in range(hosts):
            net.write_latency_file(i, ids, keys / f"latency-{i:02d}.json")
        for method in methods:
            steady = run(args, method, False, net, keys, speeds, out)
            churned = run(args, method, True, net, keys, speeds, out, first_plan(out / f"{method}-steady"))
            share, at_plan = kept(steady, churned)
            results += [steady, churned]
            print(f"{method:>14}: keeps {share:.0%} of its churn-free throughput ({at_plan:.0%} at equal plans)",
                  flush=True)
    (out / "results.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": vars(args),
                                                  "results": results}, indent=1))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
