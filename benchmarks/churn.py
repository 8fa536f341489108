"""Churn benchmark: training throughput and convergence under a seeded churn trace with silent deaths, against the
same run without churn, for SkipPipe, the full pipeline and the SWARM-style baseline.

    .venv/bin/python benchmarks/churn.py [--peers 8] [--minutes 3] [--rate 0.1] [--deaths kill,freeze] [--runs 3]
        [--checkpoint-every 10] [--plot churn.png] [--out churn.json] [--lock /tmp/skippipe-heavy.lock]

Each run is a real local swarm (coordinator and peer processes on loopback). After the first iteration is
committed, a window of `--minutes` starts; in the churn runs, peers die at the times of a seeded trace of `--rate`
x peers failures per minute, and each is replaced by a new peer `--rejoin` seconds later (volunteer swarms keep
their size on average). Deaths alternate between the kinds of `--deaths` (seeded order):

- `kill`: kill -9 of the victim's whole process tree: its connections are reset, new ones refused at once;
- `freeze`: SIGSTOP of the whole tree (peer, p2pd, DHT process, gossip sidecar): a host that dies silently,
  nothing is reset and only timeouts tell. It stays frozen to the end of the run (then it is killed).

Throughput is the tokens committed within the window over its length, the window's edges interpolated between
the commits either side (`benchmarks/throughput_window.py`: counting whole iterations moved a 20-peer window's
figure by 7-10% with where its end fell); the run goes on after the window until its next commit (at most
`TAIL_TIMEOUT` seconds) so that the iteration in progress at the end is counted for its share. The figure by whole
iterations is reported too (`tokens_per_s_whole`), as earlier results were. The churn run starts from
the plan its churn-free run drew (`--first-schedule`): each run plans on the links it measures, and two plans of
one method can differ by more than the churn costs. The data holders' ledgers are checked as well: every sample
handed out must have been processed exactly once. Each run also records how fast the machine computed in each
iteration (`benchmarks/compute_speed.py`); "kept at equal machine speed" corrects the kept share for a machine that
computed slower (or faster) in the churn run than in the steady one before its first death; and how many of the
peers' DHT stores did not answer in time (`slow_stores`, event `record_store_slow`): hundreds more than usual say the
machine was loaded, and its figures are not comparable with a quiet machine's.

Convergence (`--checkpoint-every K`, 0 = off): the peers checkpoint every K iterations, the checkpoints are copied
out as they appear, and afterwards each saved iteration's whole model is gathered and its validation loss measured
(`benchmarks/validation_curve.py`), against the seconds since the window started. The target loss (`--target-loss`,
default: the worst of the churn-free runs' best losses, so that every churn-free run reaches it) gives each run's
time to target (each run's checkpoints are deleted once measured, unless `--keep-checkpoints`). Every method
trains the same model on the same corpus; the methods' placements differ (the SWARM baseline plans its own), so
their tokens per iteration do too: compare tokens/s and time to target.

`--corpus stdlib` trains on the Python standard library's sources (`benchmarks/stdlib_corpus.py`, ~12 MB, one
module per document) instead of the bundled corpus, which the tiny model memorises within a long window (its
validation loss then climbs again, and "time to target" measures who memorises first).

`--averaging parts` and `--average-dtype bfloat16` set the stage-group averaging (`swarm.averaging`,
`swarm.average_dtype`) of every method alike; the defaults are the all-gather in float32. `--measured-speeds` has
every method's plans take the speeds the peers' passes run at (`swarm.measured_speeds`, off by default).

`--runs N` repeats the whole comparison N times (repetition r uses seed `--seed` + r: a new trace, the same for
every method within it) and prints min / median / max over the repetitions. `--lock FILE` holds an flock on FILE
during each swarm run (a machine shared with other heavy jobs). Repetitions run apart (`--seed 2 --runs 1` after a
`--runs 2`, in another session) are put together with `--merge A.json B.json [--out] [--plot]`: the files must
hold one setting and one corpus, and no seed twice; the target and the summary are computed over all of them.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.compute_speed import compute_ms, speed_ratio  # noqa: E402
from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from benchmarks.stdlib_corpus import write_stdlib_corpus  # noqa: E402
from benchmarks.throughput_window import whole_iterations_rate, window_rate  # noqa: E402
from benchmarks.validation_curve import CheckpointSnapshots, time_to_loss, validation_curve  # noqa: E402
from peers.data import Corpus, DataConfig  # noqa: E402
from peers.data_ledger import committed, read_ledger, sample_status  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402

METHODS = {"skippipe": 0.33, "full-pipeline": 0.0, "swarm": 0.0}
"""Method (its `swarm.planner`) -> skip ratio of its run."""
DEATHS = ("kill", "freeze")


def churn_trace(seed: int, peers: int, seconds: float, rate: float) -> list[float]:
    """Failure times (seconds into the window): at least `rate` x `peers` failures per minute (rounded up), evenly
    spread with seeded jitter (a Poisson draw over a few minutes can miss the stated rate by half)."""
    rng = random.Random(seed)
    count = math.ceil(rate * peers * seconds / 60.0 - 1e-9)
    gap = seconds / count if count else 0.0
    return [gap * (k + 0.5 + rng.uniform(-0.25, 0.25)) for k in range(count)]


def death_kinds(seed: int, count: int, deaths: tuple[str, ...]) -> list[str]:
    """The kind of each of `count` deaths: the kinds of `deaths` in turn, from a seeded first one (so that a short
    trace of two kinds has both)."""
    first = random.Random(seed + 2).randrange(len(deaths))
    return [deaths[(first + k) % len(deaths)] for k in range(count)]


@dataclass
class Played:
    """What `play_trace` did: the window's start (wall clock), the deaths by kind, the joins, the frozen trees."""

    start: float
    died: Counter = field(default_factory=Counter)
    joined: int = 0
    first_death: float | None = None
    """When the first peer died (wall clock); None while none has."""
    frozen: list = field(default_factory=list)
    """The Popen of each frozen peer: still stopped; `kill_frozen` kills them."""

    def kill_frozen(self, swarm: LocalSwarm) -> None:
        """Kill the frozen peers' trees (a dead host stays dead: they are never resumed); one that fails to die is
        reported, and the others are killed all the same."""
        for proc in self.frozen:
            try:
                swarm.kill(proc)
            except Exception as e:  # the unwinding goes on: LocalSwarm.stop comes next
                print(f"warning: could not kill frozen peer {proc.pid}: {type(e).__name__}: {e}", file=sys.stderr)


def play_trace(swarm: LocalSwarm, failures: list[float], window: float, rejoin: float, seed: int,
               joiner_args: Callable[[int], list[str]], deaths: tuple[str, ...] = ("kill",), *,
               played: Played | None = None) -> Played:
    """From now on for `window` seconds: at each failure time a random live peer dies (the kinds of `deaths` in
    turn, see `death_kinds`), and a new peer joins `rejoin` seconds after each death. A victim may be a joiner still
    starting (a volunteer that dies while joining): its log then stops before its DHT is up, which is no hang
    (seed 2's peer-24, frozen 9 s after it started, was read as one for three sessions). What it did goes into
    `played` as it happens (a new one if None), so that a caller interrupted meanwhile knows which trees it froze."""
    kinds = iter(death_kinds(seed, len(failures), deaths))
    events = sorted([(t, "die") for t in failures] + [(t + rejoin, "join") for t in failures])
    rng = random.Random(seed + 1)
    played = played if played is not None else Played(start=0.0)
    played.start = time.time()
    for at, what in events:
        if at >= window:
            break
        time.sleep(max(0.0, played.start + at - time.time()))
        if what == "die":
            kind = next(kinds)
            live = [p for p in swarm.peers if p.poll() is None and p not in played.frozen]
            if len(live) > 2:
                victim = rng.choice(live)
                if kind == "freeze":
                    played.frozen.append(victim)  # first: an interrupt in between must not leave it stopped
                    swarm.freeze(victim)
                else:
                    swarm.kill(victim)
                played.died[kind] += 1
                played.first_death = played.first_death or time.time()
        else:
            index = len(swarm.peers)
            swarm.add_peer(index, joiner_args(index))
            played.joined += 1
    time.sleep(max(0.0, played.start + window - time.time()))
    return played


def run_swarm(swarm: LocalSwarm, failures: list[float], window: float, rejoin: float, seed: int,
              joiner_args: Callable[[int], list[str]], deaths: tuple[str, ...], *, warmup: int = 1,
              start_timeout: float = 300.0) -> tuple[Played, list[dict]]:
    """Start `swarm`, wait for `warmup` committed iterations, play the trace through the window (`play_trace`) and
    wait for the first commit after it (`wait_past`), then stop every process (the frozen ones killed, also when
    interrupted: `LocalSwarm.stop` would SIGKILL a frozen peer but not its stopped p2pd and DHT process); what the
    trace did and the run's metrics."""
    played = Played(start=0.0)
    try:
        swarm.start()
        swarm.watch(warmup, timeout=start_timeout)
        play_trace(swarm, failures, window, rejoin, seed, joiner_args, deaths, played=played)
        return played, wait_past(swarm, played.start + window)
    finally:
        try:
            played.kill_frozen(swarm)
        finally:
            swarm.stop()


TAIL_TIMEOUT = 120.0
"""The most seconds a run goes on past its window for its next commit (the peers' iteration deadline)."""


def wait_past(swarm: LocalSwarm, end: float) -> list[dict]:
    """The run's metrics once a commit later than wall time `end` is in them, or `TAIL_TIMEOUT` seconds without a
    commit have passed (a stalled run: its window is then counted up to its last commit), or the run ended."""
    records = swarm.metrics()
    if records and records[-1]["time"] > end:
        return records
    try:
        return swarm.watch(10**9, timeout=TAIL_TIMEOUT, until=lambda recs: recs[-1]["time"] > end)
    except RuntimeError as e:  # no commit in time, or a process failed: the window counts what was committed
        print(f"warning: no commit after the window: {e}", file=sys.stderr, flush=True)
        return swarm.metrics()


def saved_plan_args(first_schedule: Path | None) -> list[str]:
    """The coordinator's flags to start from `first_schedule` (a run's plan): none when there is none."""
    return ["--first-schedule", str(first_schedule)] if first_schedule else []


def first_plan(run_dir: Path) -> Path:
    """The plan a run started from (to start another run of the same peers from it)."""
    return run_dir / "schedule-0.json"


def kept(steady: dict, churned: dict, figure: str = "tokens_per_s") -> tuple[float, float]:
    """The fraction of its churn-free throughput a method kept under churn, and the same at equal machine speed:
    times how much slower the churn run's machine computed than the steady run's before the first death
    (`compute_speed.speed_ratio`), when nothing but the machine differed between them. The first is what a user
    sees; the second leaves out a machine loaded by something else during one of the two runs (another job, a busy
    neighbour VM). It scales the whole iteration by the compute's slow-down, so it over-corrects a little where the
    iterations are not all compute. (Comparing the runs' planned iterations instead misleads: a re-plan is costed on
    the compute the peers measured while training, the first plan on their start-up profile.) `figure`: the
    throughput compared (`tokens_per_s_whole`: by whole iterations, as in results written before it was the other);
    nan where a run lacks it."""
    nan = float("nan")
    raw = churned[figure] / steady[figure] if steady.get(figure) and churned.get(figure) is not None else nan
    first = churned.get("first_death_iteration")
    ratio = speed_ratio(steady.get("compute_ms", []), churned.get("compute_ms", []), first) if first else None
    return raw, raw * ratio if ratio else nan


def window_summary(run_dir: Path, records: list[dict], start: float, window: float) -> dict:
    """Tokens/s committed within the window (`window_rate`; by whole iterations: `tokens_per_s_whole`), and how
    often the holders' ledgers say each sample handed out was processed (exactly once for every sample, or
    something was lost or doubled)."""
    inside = [r for r in records if start < r["time"] <= start + window]
    predicted = {int(f.stem.split("-")[1]): json.loads(f.read_text()).get("predicted_iteration_seconds")
                 for f in run_dir.glob("schedule-*.json")}
    planned = [predicted[r["epoch"]] for r in inside if predicted.get(r["epoch"])]
    entries = [e for f in sorted(run_dir.glob("ledger-*.jsonl")) for e in read_ledger(f)]
    status = sample_status(entries, committed(records))
    processed = Counter(c["processed"] for c in status.values())
    return {"tokens_per_s": window_rate(records, start, start + window),
            "tokens_per_s_whole": whole_iterations_rate(records, start, start + window), "iterations": len(inside),
            "planned_s": sum(planned) / len(planned) if planned else None,
            "epochs": records[-1]["epoch"] + 1 if records else 0,
            "samples_processed_times": {str(k): v for k, v in sorted(processed.items())}}


@contextmanager
def held(lock: str | None) -> Iterator[None]:
    """An exclusive flock on `lock` for the block (nothing when None)."""
    if not lock:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_config(args: argparse.Namespace, method: str, seed: int) -> str:
    data = f"\n[data]\npaths = {json.dumps([args.corpus_path])}\n" if args.corpus_path else ""
    return f"""
[run]
run_id = "churn-{method}"
stages = {args.stages}
skip = {METHODS[method]}
microbatches = 2
iterations = 0
min_peers = {args.peers}
seed = {seed}
checkpoint_every = {args.checkpoint_every}

[swarm]
planner = "{method}"
heartbeat = {args.heartbeat}
average_dtype = "{args.average_dtype}"
averaging = "{args.averaging}"
measured_speeds = {str(args.measured_speeds).lower()}
{data}"""


def run(args: argparse.Namespace, method: str, seed: int, failures: list[float], run_dir: Path,
        first_schedule: Path | None = None) -> dict:
    """One swarm of `method` through the window (`failures` empty: without churn); its figures."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config = run_dir / "run.toml"
    config.write_text(run_config(args, method, seed))
    if first_schedule:  # the same machines as the run that drew it: the same keys
        for key in first_schedule.parent.glob("*.key"):
            shutil.copy(key, run_dir / key.name)

    def peer_args(i: int) -> list[str]:
        ckpt = ["--checkpoint-dir", str(run_dir / f"ckpt-{i:02d}")] if args.checkpoint_every else []
        return ["--iteration-deadline", "120", "--ledger", str(run_dir / f"ledger-{i:02d}.jsonl"), *ckpt]

    swarm = LocalSwarm(run_dir, args.peers, run_id=f"churn-{method}",
                       coordinator_args=["--config", str(config), *saved_plan_args(first_schedule)],
                       peer_args=[peer_args(i) for i in range(args.peers)])
    snapshots = CheckpointSnapshots(run_dir, run_dir / "snapshots").start()
    try:
        with held(args.lock):
            played, records = run_swarm(swarm, failures, args.minutes * 60, args.rejoin, seed, peer_args,
                                        tuple(args.deaths.split(",")))
    finally:
        snapshots.stop()
    compute = compute_ms(run_dir)
    result = {"method": method, "churn": bool(failures), "seed": seed,
              **window_summary(run_dir, records, played.start, args.minutes * 60),
              "died": dict(played.died), "joined": played.joined,
              "compute_ms": [round(compute.get(r["iteration"], 0.0), 2) for r in records],
              "slow_stores": len(swarm.events("record_store_slow")),
              "first_death_iteration": sum(r["time"] < played.first_death for r in records)
              if played.first_death else None}
    if args.checkpoint_every:
        result["validation"] = validation_curve(run_dir / "snapshots", records, played.start, args.val_batches)
        result["snapshots_missed"] = snapshots.missed
        if not args.keep_checkpoints:  # ~1 GB a run: kept, three repetitions' filled this machine's disk
            for path in [run_dir / "snapshots", *run_dir.glob("ckpt-*")]:
                shutil.rmtree(path, ignore_errors=True)
    return result


def spread(values: list[float]) -> str:
    """min / median / max of the finite `values` ("-" when none)."""
    ok = sorted(v for v in values if v is not None and math.isfinite(v))
    return f"{ok[0]:.3g} / {statistics.median(ok):.3g} / {ok[-1]:.3g}" if ok else "-"


def default_target(results: list[dict]) -> float | None:
    """The worst of the churn-free runs' best validation losses: every churn-free run reaches it."""
    best = [min(p["loss"] for p in r["validation"]) for r in results if not r["churn"] and r.get("validation")]
    return max(best) if best else None


def summarize(results: list[dict], methods: list[str], target: float | None) -> None:
    """Print each method's figures over the repetitions (min / median / max)."""
    for method in methods:
        mine = [r for r in results if r["method"] == method]
        steady = [r for r in mine if not r["churn"]]
        churned = [r for r in mine if r["churn"]]
        pairs = [kept(s, c) for s, c in zip(steady, churned, strict=True)]
        whole = [kept(s, c, "tokens_per_s_whole")[0] for s, c in zip(steady, churned, strict=True)]
        line = (f"{method:>14}: tokens/s without churn {spread([r['tokens_per_s'] for r in steady])}, with churn "
                f"{spread([r['tokens_per_s'] for r in churned])}; kept {spread([p[0] for p in pairs])} "
                f"(at equal machine speed {spread([p[1] for p in pairs])}; by whole iterations {spread(whole)})")
        if target is not None:
            for r in mine:
                r["time_to_target_s"] = time_to_loss(r.get("validation", []), target)
            line += (f"; seconds to loss {target:.3f}: without churn "
                     f"{spread([r['time_to_target_s'] for r in steady])}, with churn "
                     f"{spread([r['time_to_target_s'] for r in churned])} (reached in "
                     f"{sum(r['time_to_target_s'] is not None for r in churned)} of {len(churned)})")
        print(line, flush=True)


def plot(results: list[dict], target: float | None, path: Path) -> None:
    """Validation loss against seconds into the window: one colour per method, solid without churn, dashed with."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for r in results:
        if not r.get("validation"):
            continue
        xs, ys = [p["seconds"] for p in r["validation"]], [p["loss"] for p in r["validation"]]
        label = f"{r['method']}, {'churn' if r['churn'] else 'no churn'}" if r["seed"] == results[0]["seed"] else None
        ax.plot(xs, ys, color=colours[r["method"]], linestyle="--" if r["churn"] else "-", alpha=0.8, label=label)
    if target is not None:
        ax.axhline(target, color="grey", linewidth=0.8, label=f"target {target:.3f}")
    ax.set_xlabel("seconds since the first committed iteration")
    ax.set_ylabel("validation loss (whole model)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=1.0,
                        help="seconds between peer records (a peer is taken for gone ~3 heartbeats after its last); "
                             "on 2 shared cores 20 peers cannot keep 1 s")
    parser.add_argument("--averaging", choices=("allgather", "parts"), default="allgather",
                        help="stage-group averaging (swarm.averaging), for every method alike")
    parser.add_argument("--average-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="stage gradients on the wire (swarm.average_dtype), for every method alike")
    parser.add_argument("--measured-speeds", action="store_true",
                        help="plans take the speeds the peers' passes run at (swarm.measured_speeds), every method")
    parser.add_argument("--minutes", type=float, default=3.0, help="length of the measured window")
    parser.add_argument("--rate", type=float, default=0.1, help="failures per peer per minute")
    parser.add_argument("--rejoin", type=float, default=20.0, help="seconds until a dead peer is replaced")
    parser.add_argument("--deaths", default="kill,freeze", help=f"kinds of death, in turn ({', '.join(DEATHS)})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=1, help="repetitions of the whole comparison")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--corpus", choices=("bundled", "stdlib"), default="bundled",
                        help="training text: the bundled corpus, or the Python standard library's sources")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="measure convergence: checkpoint every K iterations (0 = throughput only)")
    parser.add_argument("--val-batches", type=int, default=16, help="validation batches per measured checkpoint")
    parser.add_argument("--target-loss", type=float, default=None, help="default: see the module docstring")
    parser.add_argument("--plot", default=None, help="write the validation curves here (PNG)")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--lock", default=None, help="hold an flock on this file during each swarm run")
    parser.add_argument("--work-dir", default=None, help="keep the runs' directories (logs, events) here")
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each run's checkpoints once its validation curve is measured (deleted otherwise)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="run nothing: put together the --out files of runs of this setting with other seeds")
    args = parser.parse_args()
    if args.merge:
        merge(args)
        return
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS) or not methods:
        sys.exit(f"error: methods must be among {', '.join(METHODS)}")
    if set(args.deaths.split(",")) - set(DEATHS) or not args.deaths:
        sys.exit(f"error: --deaths must be among {', '.join(DEATHS)}")
    if args.runs < 1 or args.peers < 3 or args.minutes <= 0 or args.checkpoint_every < 0 or args.val_batches < 1 \
            or not args.heartbeat > 0:
        sys.exit("error: need --runs >= 1, --peers >= 3, --minutes > 0, --checkpoint-every >= 0, --val-batches >= 1, "
                 "--heartbeat > 0")
    results, corpus = [], None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.work_dir or tmp
        args.corpus_path = None
        if args.corpus == "stdlib":
            corpus = write_stdlib_corpus(Path(tmp) / "stdlib.jsonl")
            args.corpus_path = corpus["path"]
            Corpus.build(DataConfig(paths=(args.corpus_path,)))  # trains and caches the tokenizer, once
            print(f"corpus: {corpus['documents']} modules, {corpus['bytes'] / 1e6:.1f} MB of {corpus['source']}",
                  flush=True)
        for rep in range(args.runs):
            seed = args.seed + rep
            trace = churn_trace(seed, args.peers, args.minutes * 60, args.rate)
            kinds = death_kinds(seed, len(trace), tuple(args.deaths.split(",")))
            print(f"repetition {rep} (seed {seed}): {args.peers} peers, {args.stages} stages, {args.minutes:g} min "
                  f"window; deaths at {', '.join(f'{t:.0f} s ({k})' for t, k in zip(trace, kinds, strict=True))}, "
                  f"each replaced {args.rejoin:g} s later", flush=True)
            for method in methods:
                root = Path(tmp) / f"rep{rep}"
                steady = run(args, method, seed, [], root / f"{method}-steady")
                churned = run(args, method, seed, trace, root / f"{method}-churn",
                              first_plan(root / f"{method}-steady"))
                share, at_speed = kept(steady, churned)
                whole = kept(steady, churned, "tokens_per_s_whole")[0]
                results += [steady, churned]
                print(f"  {method:>14}: {steady['tokens_per_s']:.0f} tokens/s without churn, "
                      f"{churned['tokens_per_s']:.0f} with churn ({dict(churned['died'])} died, {churned['joined']} "
                      f"joined, {churned['epochs']} epochs): keeps {share:.0%} ({at_speed:.0%} at equal machine "
                      f"speed, {whole:.0%} by whole iterations); "
                      f"samples processed (times: count) steady {steady['samples_processed_times']}, churn "
                      f"{churned['samples_processed_times']}; slow DHT stores (a loaded machine) "
                      f"{steady['slow_stores']} / {churned['slow_stores']}", flush=True)
                if args.out:  # an interrupted benchmark keeps the runs it finished
                    write_results(Path(args.out), args, corpus, None, results, complete=False)
    target = args.target_loss if args.target_loss is not None else default_target(results)
    summarize(results, methods, target)
    if args.plot and target is not None:
        plot(results, target, Path(args.plot))
    if args.out:
        write_results(Path(args.out), args, corpus, target, results, complete=True)


SETTING = ("peers", "stages", "minutes", "rate", "rejoin", "deaths", "corpus", "checkpoint_every", "val_batches")
"""The arguments that make two results files one benchmark (the seeds aside), with `LATER`."""
LATER = {"heartbeat": 1.0, "averaging": "allgather", "average_dtype": "float32", "measured_speeds": False}
"""Arguments that do too, by their value in files written before they were options."""


def merge(args: argparse.Namespace) -> None:
    """Put together results files of one setting (`--merge`): summarise, plot and write them as one."""
    results, setting, corpus = [], None, None
    for name in args.merge:
        try:
            data = json.loads(Path(name).read_text())
            mine = {k: data["args"][k] for k in SETTING} | {k: data["args"].get(k, v) for k, v in LATER.items()}
            runs = list(data["results"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"error: {name} is not a results file of this benchmark: {e}")
        text = {k: v for k, v in (data.get("corpus") or {}).items() if k != "path"}  # where it was written: no
        if setting is not None and (mine != setting or text != corpus):
            sys.exit(f"error: {name} is another setting or corpus than {args.merge[0]}: {mine}, {text}")
        setting, corpus = mine, text
        results += [as_whole_iterations(r) for r in runs]
    seen = Counter((r.get("method"), r.get("churn"), r.get("seed")) for r in results)
    if twice := [k for k, n in seen.items() if n > 1]:
        sys.exit(f"error: the files hold a run twice (method, churn, seed): {twice[:3]}")
    methods = [m for m in METHODS if any(r.get("method") == m for r in results)]
    target = args.target_loss if args.target_loss is not None else default_target(results)
    print(f"{len(args.merge)} files, {len(results)} runs, seeds {sorted({r['seed'] for r in results})}", flush=True)
    summarize(results, methods, target)
    if args.plot and target is not None:
        plot(results, target, Path(args.plot))
    if args.out:
        merged = argparse.Namespace(**{**setting, "merged": list(args.merge)})
        write_results(Path(args.out), merged, corpus, target, results, complete=True)


def as_whole_iterations(run: dict) -> dict:
    """A run as this benchmark writes runs now: one written before `window_rate` has its throughput by whole
    iterations only, so that figure is its `tokens_per_s_whole`, and its interpolated one is unknown (None)."""
    if "tokens_per_s_whole" in run:
        return run
    return {**run, "tokens_per_s_whole": run.get("tokens_per_s"), "tokens_per_s": None}


def write_results(path: Path, args: argparse.Namespace, corpus: dict | None, target: float | None,
                  results: list[dict], complete: bool) -> None:
    """Write the runs so far as JSON; `complete` is false while repetitions remain (no target is chosen yet)."""
    path.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "complete": complete,
                                "args": vars(args), "corpus": corpus, "target_loss": target, "results": results},
                               indent=1))


if __name__ == "__main__":
    main()
