"""Memory and start-up CPU of gossip sidecars started cold against sidecars forked by a `SidecarStarter`.

    .venv/bin/python benchmarks/sidecar_footprint.py [--owners 6] [--runs 3]

Each run starts `--owners` real `GossipClient`s in this process (each with its own sidecar and key), links them to
the first, subscribes each to a topic, lets them idle 3 s, then reads every sidecar's PSS and CPU seconds (and the
starter's, when forked). Cold and forked runs alternate, so that both see the same machine. Prints min / median /
max over the runs of: PSS per sidecar (median over the owners), the whole (sidecars plus starter), and CPU seconds
per sidecar from its start (the starter's own import counted once per run, spread over the owners).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swarm.control.gossip import GossipClient  # noqa: E402
from swarm.control.sidecar_starter import SIDECAR_STARTER_ENV, SidecarStarter  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

MIB = 2 ** 20


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def one_run(owners: int, forked: bool) -> dict:
    starter = None
    clients: list[GossipClient] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if forked:
                starter = SidecarStarter()
                if not starter.wait_ready():
                    raise RuntimeError("the sidecar starter did not start")
                os.environ[SIDECAR_STARTER_ENV] = starter.name
            else:
                os.environ.pop(SIDECAR_STARTER_ENV, None)
            for i in range(owners):
                key = f"{tmp}/{i}.key"
                ensure_identity(key)
                client = GossipClient()
                clients.append(client)
                client.start(key, log_path=f"{tmp}/{i}.log")
            for client in clients[1:]:
                client.connect(clients[0].info.maddrs[0])
            for client in clients:
                client.subscribe("skippipe/footprint/schedule")
            time.sleep(3.0)
            procs = [psutil.Process(c.pid) for c in clients]
            pss = [p.memory_full_info().pss / MIB for p in procs]
            cpu = [cpu_seconds(p) for p in procs]
            starter_pss = starter_cpu = 0.0
            if starter is not None:
                starter_proc = psutil.Process(starter.proc.pid)
                starter_pss, starter_cpu = starter_proc.memory_full_info().pss / MIB, cpu_seconds(starter_proc)
        finally:
            for client in clients:
                client.close()
            if starter is not None:
                starter.stop()
            os.environ.pop(SIDECAR_STARTER_ENV, None)
    return {"forked": forked, "pss_per_sidecar_mib": round(statistics.median(pss), 1),
            "pss_all_mib": round(sum(pss) + starter_pss, 1), "starter_pss_mib": round(starter_pss, 1),
            "cpu_per_sidecar_s": round(statistics.median(cpu) + starter_cpu / owners, 2),
            "starter_cpu_s": round(starter_cpu, 2)}


def spread(values: list[float], digits: int = 1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--owners", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    if args.owners < 2 or args.runs < 1:
        ap.error("need --owners >= 2 and --runs >= 1")
    runs = []
    for _ in range(args.runs):
        for forked in (False, True):
            runs.append(one_run(args.owners, forked))
            print(json.dumps(runs[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    print(f"\n{args.owners} owners, {args.runs} runs each, min / median / max")
    for forked in (False, True):
        mine = [r for r in runs if r["forked"] == forked]
        pss, whole = [r["pss_per_sidecar_mib"] for r in mine], [r["pss_all_mib"] for r in mine]
        cpu = [r["cpu_per_sidecar_s"] for r in mine]
        print(f"  {'forked' if forked else 'cold':6s}  PSS per sidecar {spread(pss)} MiB, all {spread(whole)} MiB, "
              f"CPU per sidecar {spread(cpu, 2)} s")


if __name__ == "__main__":
    main()
