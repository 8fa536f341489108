"""Repetitions of a benchmark's modes, alternating, each result printed as it comes."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


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
