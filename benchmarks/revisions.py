"""The local-swarm benchmark on two revisions of this repository, run alternately: did a change cost speed or memory?

    .venv/bin/python benchmarks/revisions.py --before REV [--after HEAD] [--runs 3] [-- --peers 6 --iterations 20]

Checks each revision out in a temporary git worktree and runs its own `benchmarks/local_swarm.py` there (its code,
with this virtualenv's packages), alternating before/after so that both see the same load on this machine. Prints
each run, then min/median/max of the local swarm's median iteration, its ratio to the in-process swarm on the
same schedule, the wall time and the peak memory per peer process tree, and after/before ratios of the medians.
Nothing is committed or left behind (the worktrees are removed).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIGURES = {
    "local_s": r"median iteration: local swarm ([\d.]+) s",
    "inprocess_s": r"in-process ([\d.]+) s on the same schedule",
    "ratio": r"ratio ([\d.]+)x",
    "wall_s": r"iterations in ([\d.]+) s wall",
    "peer_rss_mib": r"peer process tree .*: median (\d+) MiB",
}


def run_once(tree: Path, extra: list[str], timeout: float) -> dict[str, float]:
    """One run of `tree`'s local-swarm benchmark; its figures by name."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(tree / "benchmarks" / "local_swarm.py"), *extra], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{tree.name}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    figures = {}
    for name, pattern in FIGURES.items():
        found = re.search(pattern, out.stdout)
        if found is None:
            raise RuntimeError(f"{tree.name}: no {name} in the output:\n{out.stdout[-2000:]}")
        figures[name] = float(found.group(1))
    return figures


def summary(runs: list[dict[str, float]], name: str) -> tuple[float, float, float]:
    values = [r[name] for r in runs]
    return min(values), statistics.median(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the baseline revision")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    parser.add_argument("extra", nargs="*", help="flags for benchmarks/local_swarm.py (after --)")
    args = parser.parse_args()
    revs = {"before": args.before, "after": args.after}
    results: dict[str, list[dict[str, float]]] = {k: [] for k in revs}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        try:
            for key, rev in revs.items():
                trees[key] = Path(tmp) / key
                subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(trees[key]), rev],
                               check=True)
            for i in range(args.runs):
                for key in revs:
                    figures = run_once(trees[key], args.extra, args.timeout)
                    results[key].append(figures)
                    print(f"run {i + 1} {key} ({revs[key]}): " + ", ".join(f"{k} {v:g}" for k, v in figures.items()),
                          flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"\n{args.runs} runs each (min / median / max):")
    for name in FIGURES:
        b, a = summary(results["before"], name), summary(results["after"], name)
        print(f"  {name:13s} before {b[0]:8.3f} / {b[1]:8.3f} / {b[2]:8.3f}   after {a[0]:8.3f} / {a[1]:8.3f} / "
              f"{a[2]:8.3f}   after/before (medians) {a[1] / b[1]:.2f}")


if __name__ == "__main__":
    main()
