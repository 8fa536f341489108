"""Per-peer memory footprint (PSS of each peer's process tree) of a small local swarm, with and without padding.

    .venv/bin/python benchmarks/peer_footprint.py [--peers 4] [--runs 3] [--message-bytes 0,16777216]

Each run is a real local swarm on loopback (a coordinator and `--peers` peer processes, tiny model, 3 stages, no
skip, 2 microbatches per holder). Once iteration 2 is committed, and again at each of the next iterations up to
`--iterations`, every peer's tree is measured (`benchmarks.wan.footprint`: PSS by kind of process); a run's figure
per kind is the median over its samples of the median over its peers, and its largest tree is the max over them.
Prints min / median / max over the runs, per `--message-bytes` setting (0: no padding), and one example tree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from benchmarks.wan.footprint import KINDS, swarm_footprint  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.peer.timeline import read_spans  # noqa: E402


def config(message_bytes: int, iterations: int, peers: int) -> str:
    padding = f"message_bytes = {message_bytes}\n" if message_bytes else ""
    return ("[run]\nrun_id = 'footprint'\nmodel = 'tiny'\nstages = 3\nskip = 0\nmicrobatches = 2\n"
            f"iterations = {iterations}\nmin_peers = {peers}\n[data]\nseq_len = 32\nbatch_size = 4\n"
            f"[swarm]\nheartbeat = 2.0\n{padding}")


def one_run(args: argparse.Namespace, message_bytes: int, root: Path, index: int) -> dict:
    run_dir = root / f"pad{message_bytes}-{index}"
    run_dir.mkdir(parents=True)
    (run_dir / "run.toml").write_text(config(message_bytes, args.iterations, args.peers))
    peer_args = [["--stage", str(i % 3), "--emulate-speed", "0.02"] for i in range(args.peers)]
    swarm = LocalSwarm(run_dir, args.peers, run_id="footprint",
                       coordinator_args=["--config", str(run_dir / "run.toml")], peer_args=peer_args,
                       env=dict(kv.split("=", 1) for kv in args.env),
                       warm_start=False)  # a volunteer's peer starts cold, alone on its machine: measure that one
    samples = []
    try:
        swarm.start()
        for n in range(2, args.iterations + 1):
            swarm.watch(n, timeout=240)
            samples.append(swarm_footprint([p.pid for p in swarm.peers]))
    finally:
        swarm.stop()
    sends = [s["end"] - s["start"] for s in read_spans(run_dir.glob("peer-*.trace.jsonl"))
             if s["kind"] in ("send_forward", "send_backward")]
    return {"send_median_s": round(statistics.median(sends), 4) if sends else None,
            "median_mib": {k: round(statistics.median(s["median_mib"].get(k, 0.0) for s in samples), 1)
                           for k in KINDS},
            "total_median_mib": round(statistics.median(s["total_median_mib"] for s in samples), 1),
            "total_max_mib": max(s["total_max_mib"] for s in samples),
            "processes_per_peer": samples[-1]["processes_per_peer"], "example_tree": samples[-1]["example_tree"]}


def spread(values: list[float]) -> str:
    return f"{min(values):.0f} / {statistics.median(values):.0f} / {max(values):.0f}"


def spread3(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--message-bytes", default="0,16777216", help="comma-separated; 0 = no padding")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every process of the swarm")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args()
    results: dict[int, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="skippipe-footprint-") as tmp:
        for index in range(args.runs):
            for message_bytes in (int(b) for b in args.message_bytes.split(",")):
                run = one_run(args, message_bytes, Path(tmp), index)
                results.setdefault(message_bytes, []).append(run)
                print(f"message_bytes={message_bytes} run {index}: {run['total_median_mib']} MiB per tree "
                      f"(max {run['total_max_mib']}), {run['median_mib']}, send median {run['send_median_s']} s",
                      flush=True)
    print(f"\n{args.peers} peers, {args.runs} runs; MiB, min / median / max over the runs of each run's median peer")
    for message_bytes, runs in results.items():
        print(f"message_bytes={message_bytes}: tree {spread([r['total_median_mib'] for r in runs])} "
              f"(largest tree {max(r['total_max_mib'] for r in runs):.0f}); processes per peer "
              f"{runs[-1]['processes_per_peer']}; pipeline send s {spread3([r['send_median_s'] for r in runs])}")
        for kind in KINDS:
            print(f"  {kind:15s} {spread([r['median_mib'][kind] for r in runs])}")
        for row in runs[-1]["example_tree"]:
            print(f"    {row['kind']:15s} {row['pss_mib']:7.1f}  {row['name']}: {row['cmd'][:90]}")
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
