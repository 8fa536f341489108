"""Repetitions of a benchmark's modes, alternating, each result printed as it comes."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from swarm.local.local_swarm import LocalSwarm


def alternate(args: argparse.Namespace, modes: Sequence[str],
              run: Callable[[argparse.Namespace, str, int, Path], dict]) -> list[dict]:
    """`run(args, mode, r, root)` for every mode in each of `args.runs` repetitions r, the modes alternating within a
    repetition (a machine whose load drifts over the hours weighs on every mode alike); each result is printed as a
    JSON line once it is in. The run directories go under `args.keep` (kept) or a temporary directory."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for index in range(args.runs):
            for mode in modes:
                results.append(run(args, mode, index, root))
                print(json.dumps(results[-1]), flush=True)
    return results


def print_ratios(median: Mapping[str, float], pairs: Sequence[tuple[str, str]]) -> None:
    """Print each (mode, base) of `pairs`' median tokens/s over its base's, where both ran."""
    for mode, base in pairs:
        if mode in median and median.get(base):
            print(f"median tokens/s, {mode} / {base}: {median[mode] / median[base]:.2f}x")


def save(args: argparse.Namespace, results: list[dict]) -> None:
    """Write the date, the arguments and `results` as JSON to `args.out`, if given."""
    if args.out:
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": vars(args),
                                              "results": results}, indent=1))


def repetition_parser(doc: str | None, modes: Sequence[str]) -> argparse.ArgumentParser:
    """A benchmark's command line with the options every repeated local-swarm benchmark takes: `--peers`, `--runs`,
    `--modes` (comma-separated, default all of `modes`), `--out` and `--keep`; the benchmark adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(modes))
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--keep", default=None, help="keep the run directories here (logs, events)")
    return parser


def window_parser(doc: str | None, modes: Sequence[str], *, minutes: float, minutes_help: str,
                  emulate_speed: float | None, emulate_help: str) -> argparse.ArgumentParser:
    """`repetition_parser` with the options of a benchmark that measures a window of a local swarm started by
    `run_config`: `--minutes` (the window), `--emulate-speed` (every peer's seconds per layer; None: real compute) and
    `--microbatches` (per holder)."""
    parser = repetition_parser(doc, modes)
    parser.add_argument("--minutes", type=float, default=minutes, help=minutes_help)
    parser.add_argument("--emulate-speed", type=float, default=emulate_speed, help=emulate_help)
    parser.add_argument("--microbatches", type=int, default=4, help="microbatches per holder (run.microbatches)")
    return parser


def window_modes(args: argparse.Namespace, modes: Sequence[str], *, min_peers: int, more_ok: bool = True,
                 more: str = "") -> list[str]:
    """The modes `args.modes` asks for, once `window_parser`'s options are checked (and the benchmark's own:
    `more_ok`, said as `more`); exits with the rules otherwise."""
    chosen = [m for m in args.modes.split(",") if m]
    if set(chosen) - set(modes) or args.runs < 1 or args.minutes <= 0 or args.peers < min_peers or not more_ok:
        sys.exit(f"error: modes must be among {', '.join(modes)}; --runs >= 1, --minutes > 0, --peers >= {min_peers}"
                 + (f", {more}" if more else ""))
    return chosen


def spread(values: list[float]) -> str:
    """min / median / max of `values`, to the unit."""
    return f"{min(values):.0f} / {statistics.median(values):.0f} / {max(values):.0f}"


def summarize(results: list[dict], modes: Sequence[str], more: Callable[[list[dict]], str]) -> dict[str, float]:
    """Print each mode's tokens/s and iterations (min / median / max over its runs) and `more(its runs)`; the median
    tokens/s of each mode."""
    median = {}
    for mode in modes:
        mine = [r for r in results if r["mode"] == mode]
        median[mode] = statistics.median(r["tokens_per_s"] for r in mine)
        print(f"{mode:>11}: tokens/s {spread([r['tokens_per_s'] for r in mine])} (min/median/max), iterations "
              f"{spread([r['iterations'] for r in mine])}, {more(mine)}")
    return median


def run_config(root: Path, mode: str, index: int, run_id: str, args: argparse.Namespace, swarm: str) -> Path:
    """The run directory of `mode`'s repetition `index` under `root`, made, with its `run.toml`: 3 stages, 33% skip,
    `args.microbatches` per holder, until stopped, `args.peers` awaited, seed `index`, and the `[swarm]` lines
    `swarm`."""
    run_dir = root / f"{mode}-{index}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.toml").write_text(f"[run]\nrun_id = '{run_id}'\nstages = 3\nskip = 0.33\n"
                                      f"microbatches = {args.microbatches}\niterations = 0\nmin_peers = {args.peers}\n"
                                      f"seed = {index}\n[swarm]\n{swarm}\n")
    return run_dir


def hold_window(swarm: LocalSwarm, start: float, seconds: float) -> None:
    """Let `swarm` run until `seconds` after `start`; raises RuntimeError as soon as one of its processes exits (a run
    with a dead peer or coordinator measures nothing of what it was set up for)."""
    while time.time() < start + seconds:
        time.sleep(1.0)
        if any(p.poll() is not None for p in swarm.peers) or \
                (swarm.coordinator is not None and swarm.coordinator.poll() is not None):
            raise RuntimeError(f"a process of the swarm exited; logs in {swarm.run_dir}")
