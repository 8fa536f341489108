"""A data holder or relay slower than it announced (issue #19): throughput with holder shares and benches, without
them, and unthrottled.

    .venv/bin/python benchmarks/slow_holder.py [--peers 6] [--runs 3] [--minutes 2] [--running 0.05] [--stopped 0.95]
        [--emulate-speed SECONDS] [--microbatches 4] [--modes shares,fixed,unbenched,unthrottled]
        [--victim holder|relay] [--out F.json] [--keep DIR]

Each run is a real local swarm (coordinator and peer processes on loopback, 3 stages, 33% skip, the tiny model's
real compute; `--emulate-speed` pads every operation to that many seconds per layer instead, but a padded operation
mostly sleeps, and a throttle barely slows a sleep). Once iteration 3 is committed, one data holder's peer process is
throttled (`swarm.local.throttle`: it runs `--running` s of every `--running + --stopped`, a machine taken by its
owner's job; it announced the speed it measured at its start). Throughput is the tokens of the iterations committed
within the `--minutes` window that starts then, over its length. The default throttle (5% of the time) is harsh
because this tiny model's iterations last about a second here (6 peers), below the 3-s floor of 'late'
(`swarm.lateness.LATE_FLOOR`): at 25% the holder was never late enough to be left out. A real model's iterations last
tens of seconds, where a holder two or three times slower than the others is late by far more than the floor.

Modes, alternating within each repetition (repetition r uses seed r):
- `shares`: the default, `swarm.holder_shares = true`: left out for being late twice in three iterations, the slow
  holder is given half its microbatches (down to a quarter, one at least) by a re-plan, and late so at its smallest
  share it is benched: planned without for 300 s (`swarm.coordinator.benches`), longer than the window, so the
  window does not show it placed again (and slow again) after its bench;
- `fixed`: `swarm.holder_shares = false`: it keeps its microbatches; left out of the commits it is late in, it is
  waited for every third iteration (`CommitTracker.late`);
- `unbenched`: `swarm.bench_seconds = 0`: shares as in `shares`, but no peer is ever benched (at its smallest share
  the slow holder stays; a slow relay keeps its work);
- `unthrottled`: the same swarm with no holder throttled (the ceiling the others are read against).

`--victim relay` throttles a peer of a later stage instead (no data of its own, a stage mate beside it): its
slowness shows as lateness of the holders whose microbatches pass it, which the scheduler must not take for their own
(`SlowHolders` compares each late holder's seconds per pass with the others'; `others_shared`, `others_benched`: share
changes and benches of peers that were not throttled), and in its own pace reports, from which the scheduler benches it
(`SlowRelays`; compare `shares` with `unbenched`).

Prints each run (tokens/s, iterations committed in the window, commits that left the slow holder out, its
microbatches per iteration at the end, its share changes and benches, seconds from the throttle to its bench),
min/median/max per mode, and the median ratios shares/fixed and each against
unthrottled.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.repetitions import (  # noqa: E402
    alternate,
    hold_window,
    print_ratios,
    run_config,
    save,
    spread,
    summarize,
    window_modes,
    window_parser,
)
from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.local.throttle import Throttle  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

MODES = ("shares", "fixed", "unbenched", "unthrottled")
START_AFTER = 3


def window_figures(records: list[dict], start: float, seconds: float, slow: str) -> dict:
    """Tokens/s of the iterations committed in [start, start + seconds], their count, and how many left `slow` out."""
    inside = [r for r in records if start <= r["time"] <= start + seconds]
    tokens = sum((r["tokens_per_s"] or 0) * r["iteration_seconds"] for r in inside)
    return {"tokens_per_s": round(tokens / seconds, 1), "iterations": len(inside),
            "slow_left_out": sum(slow in r["left_out"] for r in inside)}


def run(args: argparse.Namespace, mode: str, index: int, root: Path) -> dict:
    run_dir = run_config(root, mode, index, "slow", args,
                         f"holder_shares = {'false' if mode == 'fixed' else 'true'}\n"
                         f"{'bench_seconds = 0' if mode == 'unbenched' else ''}")
    config = run_dir / "run.toml"
    swarm = LocalSwarm(run_dir, args.peers, run_id="slow", coordinator_args=["--config", str(config)],
                       peer_args=["--iteration-deadline", "120",
                                  *(["--emulate-speed", str(args.emulate_speed)] if args.emulate_speed else [])])
    throttle = None
    try:
        swarm.start()
        swarm.watch(START_AFTER, timeout=600)
        ids = {ensure_identity(str(run_dir / f"peer-{i:02d}.key")): i for i in range(args.peers)}
        schedule = swarm.schedule()
        slow = max({r["origin"] for r in schedule["routes"]}) if args.victim == "holder" else \
            max(p for p, stage in schedule["placement"].items() if stage > 0)
        stage = schedule["placement"][slow]
        alone = sum(st == stage for st in schedule["placement"].values()) == 1
        start = time.time()
        if mode != "unthrottled":
            throttle = Throttle(swarm.peers[ids[slow]].pid, running=args.running, stopped=args.stopped).start()
        hold_window(swarm, start, 60 * args.minutes)
        records = swarm.metrics()
        microbatches = sum(r["origin"] == slow for r in swarm.schedule()["routes"]) if args.victim == "holder" \
            else None
        shares = swarm.events("holder_share", who="coordinator")
        benches = swarm.events("holder_benched", who="coordinator") + \
            swarm.events("relay_benched", who="coordinator")
        shares, benches = [e for e in shares if e["time"] >= start], [e for e in benches if e["time"] >= start]
    finally:
        if throttle is not None:
            throttle.close()
        swarm.stop()
    return {"mode": mode, "run": index, **window_figures(records, start, 60 * args.minutes, slow),
            "slow_alone_in_stage": alone, "slow_microbatches_at_end": microbatches, "share_changes": len(shares),
            "benched": len(benches),
            "benched_after_s": round(benches[0]["time"] - start, 1) if benches else None,
            "others_shared": sum(e["peer"] != slow for e in shares),
            "others_benched": sum(e["peer"] != slow for e in benches)}


def main() -> None:
    unwind_on_sigterm()
    parser = window_parser(__doc__, MODES, minutes=2.0, minutes_help="the window measured after the throttle starts",
                           emulate_speed=None,
                           emulate_help="pad every peer's operations to this many seconds per layer (default: real "
                                        "compute)")
    parser.add_argument("--running", type=float, default=0.05, help="seconds the slow holder runs per cycle")
    parser.add_argument("--stopped", type=float, default=0.95, help="seconds it is stopped per cycle")
    parser.add_argument("--victim", choices=("holder", "relay"), default="holder",
                        help="throttle a data holder (default) or a peer of a later stage")
    args = parser.parse_args()
    modes = window_modes(args, MODES, min_peers=4)
    results = alternate(args, modes, run)
    median = summarize(results, modes,
                       lambda mine: f"the slow holder left out of {spread([r['slow_left_out'] for r in mine])}")
    print_ratios(median, [("shares", "fixed"), ("shares", "unbenched"), ("shares", "unthrottled"),
                          ("fixed", "unthrottled"), ("unbenched", "unthrottled")])
    save(args, results)

if __name__ == "__main__":
    main()
