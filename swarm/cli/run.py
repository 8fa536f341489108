"""`skippipe coordinator start`, `skippipe-peer join` and `skippipe swarm local`: the networked runtime's commands.

Thin, like Petals' run_server: parse flags, build the options, call one function, and in `finally` leave
the swarm. SIGINT / SIGTERM set an event the loops check (`stop_signal`), so a peer finishes its iteration and leaves.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

import click

from swarm.cli.stop_signal import stop_event
from swarm.cli.train import swarm as swarm_group
from swarm.constants import FAULTS

DEFAULT_IDENTITY = Path.home() / ".skippipe" / "identity.key"


def _logging(log_file: str | None, level: str, *, events: str | None = None, identity: str | None = None) -> None:
    """Log to `log_file` (stderr if None); with `events`, also record this process's typed events there."""
    logging.basicConfig(level=getattr(logging, level), filename=log_file,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(logging.WARNING)
    if events:
        from swarm.events import EventLog
        from swarm.net.identity import ensure_identity

        Path(identity).parent.mkdir(parents=True, exist_ok=True)
        EventLog.install(events, ensure_identity(identity))


EVENTS_HELP = "append this process's typed events here (JSON lines, swarm.events)"


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


_held: list = []
"""Locks this process holds for its whole life (its identity, its entry among the host's peers)."""


def _claim_identity(identity: str) -> str:
    """Claim the key file for this process (`swarm.net.identity_lock`): without --identity, the first free default
    slot (identity.key, identity-2.key, ...), so peers started by hand on one machine get distinct peer ids; an
    --identity another live process holds is a one-line error."""
    from swarm.net.identity_lock import IdentityTaken, claim_identity

    given = click.get_current_context().get_parameter_source("identity") != click.core.ParameterSource.DEFAULT
    try:
        path, lock = claim_identity(identity, numbered=not given)
    except (IdentityTaken, OSError) as e:
        _fail(str(e))
    _held.append(lock)
    return str(path)


@click.group()
def coordinator() -> None:
    """Start and run a training run's coordinator."""


@coordinator.command("start")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), help="run.toml")
@click.option("--run-id", default=None, help="overrides run.run_id")
@click.option("--iterations", type=int, default=None, help="overrides run.iterations (0 = until stopped)")
@click.option("--min-peers", type=int, default=None, help="overrides run.min_peers")
@click.option("--stages", type=int, default=None, help="overrides run.stages")
@click.option("--skip", type=float, default=None, help="overrides run.skip")
@click.option("--seed", type=int, default=None, help="overrides run.seed")
@click.option("--microbatches", type=int, default=None, help="overrides run.microbatches")
@click.option("--checkpoint-every", type=int, default=None, help="overrides run.checkpoint_every")
@click.option("--init-from", type=click.Path(exists=True, file_okay=False), default=None,
              help="overrides run.init_from: start from this checkpoint's weights (e.g. import-hf's output)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=0, show_default=True, help="DHT port (0 = any free port)")
@click.option("--identity", type=click.Path(dir_okay=False), default=str(DEFAULT_IDENTITY), show_default=True)
@click.option("--run-dir", type=click.Path(file_okay=False), default="runs/coordinator", show_default=True,
              help="address file, schedules and metrics")
@click.option("--metrics", type=click.Path(dir_okay=False), default=None, help="one JSON line per iteration")
@click.option("--first-schedule", type=click.Path(exists=True, dir_okay=False), default=None,
              help="start from a saved plan of these peers (an earlier run's schedule-N.json) instead of planning")
@click.option("--allow", "allow_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="admit the peer ids listed in this file (one a line, # comments) instead of join token holders")
@click.option("--open", "open_run", is_flag=True, help="admit anyone who reaches the run (no join token)")
@click.option("--relay", is_flag=True,
              help="relay for peers that cannot be dialled (behind NAT; experimental, see docs/nat.md)")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None)
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING"]), default="INFO")
@click.option("--events", type=click.Path(dir_okay=False), default=None, help=EVENTS_HELP)
def start(config_path, run_id, iterations, min_peers, stages, skip, seed, microbatches, checkpoint_every, init_from,
          host, port, identity, run_dir, metrics, first_schedule, allow_file, open_run, relay, log_file, log_level,
          events) -> None:
    """Bootstrap the DHT, publish the run, plan from the live swarm and log its progress."""
    from peers.data import Corpus
    from scheduler.schedule import Schedule, ScheduleError, validate
    from swarm.control.membership import read_allow_file
    from swarm.coordinator.coordinator import Coordinator, CoordinatorOptions, RunDirError
    from swarm.coordinator.replanner import saved_plan_mismatch
    from swarm.run_config import RunConfig

    overrides = dict(run_id=run_id, iterations=iterations, min_peers=min_peers, stages=stages, skip=skip, seed=seed,
                     microbatches=microbatches, checkpoint_every=checkpoint_every, init_from=init_from)
    try:
        config = RunConfig.from_toml(config_path, **overrides) if config_path else \
            RunConfig.from_tables({}, **overrides)
        if config.architecture is not None:  # an explicit model must hold every token of the run's tokenizer
            config.model_config(Corpus.build(config.data).vocab_size)
    except ValueError as e:
        _fail(str(e))
    saved = None
    if first_schedule:
        try:
            saved = Schedule.from_json(Path(first_schedule).read_text())
            validate(saved)
        except (OSError, UnicodeDecodeError, ScheduleError) as e:
            _fail(f"--first-schedule {first_schedule}: {e}")
        mismatch = saved_plan_mismatch(saved, config)
        if mismatch:
            _fail(f"--first-schedule {first_schedule} cannot start this run: {mismatch}")
    Path(identity).parent.mkdir(parents=True, exist_ok=True)
    if allow_file and open_run:
        _fail("--allow and --open contradict each other: choose one")
    allowed: tuple[str, ...] = ()
    if allow_file:
        try:
            allowed = read_allow_file(allow_file)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            _fail(f"--allow {allow_file}: {e}")
    if relay and config.averaging == "hivemind":
        from swarm.net.reachability import NOT_OVER_RELAYS

        _fail(f"--relay: {NOT_OVER_RELAYS}")
    admission = "open" if open_run else "allow" if allow_file else "token"
    identity = _claim_identity(identity)
    _logging(log_file, log_level, events=events, identity=identity)
    logging.getLogger("swarm").info("coordinator identity: %s", identity)
    import torch

    torch.set_num_threads(1)  # it plans and records; its peers need the cores
    node = Coordinator(CoordinatorOptions(config=config, identity_path=identity, host=host, port=port,
                                          run_dir=run_dir, metrics_path=metrics, first_schedule=saved,
                                          admission=admission, allowed=allowed, relay=relay))
    try:
        node.run(stop_event())
    except RunDirError as e:
        _fail(str(e))


@click.command("join")
@click.option("--initial-peers", multiple=True, required=True, help="multiaddr of a peer or the coordinator")
@click.option("--coordinator", default=None,
              help="peer id of the run's coordinator, the only run spec signer trusted (default: the peer id in the "
                   "first --initial-peers address)")
@click.option("--run", "run_id", default="skippipe", show_default=True, help="run id to join")
@click.option("--token", default=None, envvar="SKIPPIPE_JOIN_TOKEN",
              help="the run's join token (the coordinator prints it; or set SKIPPIPE_JOIN_TOKEN)")
@click.option("--device", default="cpu", show_default=True, help="torch device (cpu, cuda, cuda:1)")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="compute precision (auto: the run's train.precision; fp32 or bf16 may compute more precisely "
                   "than the run; a device that cannot compute as asked is refused on joining)")
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="torch threads [default: this machine's cores shared among the skippipe peers running on it]")
@click.option("--stage", default="auto", show_default=True,
              help="stage to serve, or auto (the scheduler may still move it to take over a stage whose last peer "
                   "leaves)")
@click.option("--data", "data_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="own training files: this peer becomes a data holder")
@click.option("--identity", type=click.Path(dir_okay=False), default=str(DEFAULT_IDENTITY), show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=0, show_default=True)
@click.option("--announce-addr", "announce_addrs", multiple=True,
              help="multiaddr to announce instead of the bound one, e.g. a forwarded port /ip4/PUBLIC_IP/tcp/PORT "
                   "(repeatable)")
@click.option("--reachability", type=click.Choice(["auto", "public", "relayed"]), default="auto", show_default=True,
              help="relayed: this peer cannot be dialled and is reached through the coordinator's relay (which "
                   "must run with --relay); public: it can, and relays for others; auto: public with "
                   "--announce-addr, else neither (experimental, see docs/nat.md)")
@click.option("--iteration-deadline", type=float, default=300.0, show_default=True,
              help="seconds an iteration may take before this peer gives up on it")
@click.option("--join-timeout", type=click.FloatRange(min=1, max=86400), default=120.0, show_default=True,
              help="seconds to wait for the run spec and for a schedule that places this peer")
@click.option("--state-timeout", type=click.FloatRange(min=1, max=86400), default=120.0, show_default=True,
              help="seconds a joiner waits for its stage's state from the stage's peers (counted from the last "
                   "piece received, while a large state comes in pieces) before it gives the placement up and is "
                   "placed elsewhere")
@click.option("--log-file", type=click.Path(dir_okay=False), default=None)
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING"]), default="INFO")
@click.option("--log-param-digest", is_flag=True, help="log a digest of the stage's weights after each step")
@click.option("--events", type=click.Path(dir_okay=False), default=None, help=EVENTS_HELP)
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False), default=None,
              help="where to write the run's metrics if this peer becomes the scheduler")
@click.option("--ledger", type=click.Path(dir_okay=False), default=None,
              help="a data holder appends its data ledger here (JSON lines)")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="write this peer's checkpoint here every run.checkpoint_every iterations")
@click.option("--init-from", type=click.Path(exists=True, file_okay=False), default=None,
              help="this peer's copy of the checkpoint the run starts from (run.init_from)")
@click.option("--probe-sample", type=click.IntRange(1, 256), default=8, show_default=True,
              help="peers whose links one probing round measures")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="append this peer's timeline (compute and send spans, JSON lines) here")
@click.option("--emulate-speed", "emulate_speed", type=click.FloatRange(min=0, max=60, min_open=True), default=None,
              help="compute emulation: seconds per layer of the device to emulate (operations are padded to it)")
@click.option("--emulate-drift", type=click.FloatRange(min=1, max=100), default=1.0, show_default=True,
              help="compute emulation: run this many times slower than the --emulate-speed announced (a machine "
                   "whose owner started a job after it measured itself)")
@click.option("--emulate-latency", "latency_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="link emulation: JSON file of one-way latencies to peers, added by the transport (read again "
                   "when it changes)")
@click.option("--fault", type=click.Choice(FAULTS), default=None,
              help="misbehave on purpose, to test a swarm's defences (never on a run you care about)")
def join(initial_peers, coordinator, run_id, token, device, precision, threads, stage, data_paths, identity, host,
         port, announce_addrs, reachability, iteration_deadline, join_timeout, state_timeout, log_file, log_level,
         log_param_digest, events, metrics_path, ledger, checkpoint_dir, init_from, probe_sample, trace_path,
         emulate_speed, emulate_drift, latency_file, fault) -> None:
    """Join a run: measure, announce, get placed, train; Ctrl+C leaves cleanly."""
    from swarm.control.membership import check_token
    from swarm.coordinator.scheduler_role import SchedulerRole
    from swarm.peer.console import install_console
    from swarm.peer.host_share import HOST_REGISTRY, HostRegistry, ThreadShare
    from swarm.peer.members import NotAdmitted
    from swarm.peer.options import PeerOptions, trusted_coordinator
    from swarm.peer.peer import Peer
    from swarm.peer.run_spec import UnsuitedRun
    from swarm.peer.startup_watch import started, watch_startup

    if stage != "auto" and not stage.isdigit():
        _fail(f"--stage must be a stage number or auto, got {stage!r}")
    for name, seconds in (("--join-timeout", join_timeout), ("--state-timeout", state_timeout),
                          ("--emulate-drift", emulate_drift)):
        if math.isnan(seconds):  # NaN passes click's range check
            _fail(f"{name} must be a number, got nan")
    if emulate_drift != 1.0 and not emulate_speed:
        _fail("--emulate-drift slows an emulated device: it needs --emulate-speed")
    from swarm.net.reachability import announce_problem

    for problem in filter(None, map(announce_problem, announce_addrs)):
        _fail(f"--announce-addr {problem}")
    try:
        coordinator = trusted_coordinator(tuple(initial_peers), coordinator)
        if token is not None:
            check_token(token)
    except ValueError as e:
        _fail(str(e))
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            _fail("--device cuda, but CUDA is not available on this machine")
    latency = None
    if latency_file:
        from swarm.local.emulated_network import LatencyFile

        try:
            latency = LatencyFile(latency_file)
        except ValueError as e:
            _fail(str(e))
    identity = _claim_identity(identity)
    _logging(log_file, log_level, events=events, identity=identity)
    install_console()
    registry: Path | None = HOST_REGISTRY
    try:
        _held.append(HostRegistry(registry))
        _held[-1].join()  # held for this process's life
    except OSError as e:
        logging.getLogger("swarm").warning("cannot register in %s (%s): this peer counts itself alone on this "
                                           "machine when it sizes its threads", registry, e)
        registry = None
    share = ThreadShare(threads, registry)
    logging.getLogger("swarm").info("identity %s; torch uses %d thread(s)", identity, share.apply())
    options = PeerOptions(initial_peers=tuple(initial_peers), identity_path=identity, coordinator=coordinator,
                          token=token, run_id=run_id, host=host, announce_addrs=announce_addrs,
                          reachability=reachability, port=port, stage=None if stage == "auto" else int(stage),
                          data_paths=tuple(data_paths),
                          device=device, precision=precision, iteration_deadline=iteration_deadline,
                          join_timeout=join_timeout, state_timeout=state_timeout,
                          log_gossip=(log_file + ".gossip") if log_file else None,
                          log_param_digest=log_param_digest, checkpoint_dir=checkpoint_dir, ledger_path=ledger,
                          init_from=init_from, metrics_path=metrics_path, trace_path=trace_path,
                          emulate_seconds_per_layer=emulate_speed, emulate_drift=emulate_drift,
                          link_latency=latency, probe_sample=probe_sample, fault=fault, threads=threads,
                          host_registry=str(registry) if registry else None)
    watch_startup()  # a peer hung before its DHT is up dumps its threads' stacks to stderr
    try:
        restart_as = Peer(options, scheduler_role=SchedulerRole).run(stop_event())
    except (NotAdmitted, TimeoutError, UnsuitedRun) as e:  # refused, unanswered, or cannot serve: say why
        said = str(e)  # ours always say why; a library's bare timeout does not: its traceback goes to the log
        logging.getLogger("swarm").error("%s", said or f"{type(e).__name__} while joining", exc_info=not said)
        _fail(said or f"{type(e).__name__} while joining (the traceback is in the log)")
    finally:
        started()  # however it ended, nothing to dump later
    if restart_as is not None:
        _restart_with("--reachability", restart_as)


def _restart_with(*args: str) -> None:
    """Replace this process by itself with `args` added to its command line (click takes an option's last value):
    same pid (whoever started it still holds it), same key; its helpers are stopped already, and its locks, on
    descriptors closed by the exec, are claimed again by the new image."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:], *args])


@swarm_group.command("local")
@click.option("--peers", "num_peers", type=click.IntRange(1, 64), default=6, show_default=True)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), help="run.toml")
@click.option("--iterations", type=click.IntRange(0, 10_000_000), default=30, show_default=True,
              help="end the run after this many iterations (0 = until Ctrl+C)")
@click.option("--stages", type=int, default=None)
@click.option("--skip", type=float, default=None)
@click.option("--seed", type=int, default=None)
@click.option("--metrics", type=click.Path(dir_okay=False), default=None, help="one JSON line per iteration")
@click.option("--run-dir", type=click.Path(file_okay=False), default="runs/local", show_default=True)
@click.option("--init-from", type=click.Path(exists=True, file_okay=False), default=None,
              help="start from this checkpoint's weights (coordinator and every peer read it)")
def local(num_peers, config_path, iterations, stages, skip, seed, metrics, run_dir, init_from) -> None:
    """A coordinator and N peers as processes on loopback, with a live progress display."""
    from peers.data import Corpus
    from swarm.local.local_swarm import LocalSwarm
    from swarm.run_config import RunConfig

    overrides = dict(iterations=iterations, min_peers=num_peers, stages=stages, skip=skip, seed=seed,
                     init_from=init_from)
    try:
        config = RunConfig.from_toml(config_path, **overrides) if config_path else \
            RunConfig.from_tables({}, **overrides)
        # train and cache the tokenizer once, before the processes race for it; an explicit model must hold its tokens
        config.model_config(Corpus.build(config.data).vocab_size)
    except ValueError as e:
        _fail(str(e))
    args = ["--iterations", str(iterations), "--min-peers", str(num_peers)]
    if config_path:
        args += ["--config", config_path]
    for flag, value in (("--stages", stages), ("--skip", skip), ("--seed", seed), ("--init-from", init_from)):
        if value is not None:
            args += [flag, str(value)]
    if metrics:
        args += ["--metrics", metrics]
    run = LocalSwarm(run_dir, num_peers, run_id=config.run_id, coordinator_args=args,
                     peer_args=["--init-from", config.init_from] if config.init_from else ())
    if metrics:
        run.metrics_path = Path(metrics)
    click.echo(f"starting a coordinator and {num_peers} peers ({config.model}, {config.stages} stages, "
               f"skip {config.skip}); logs in {run_dir}")
    shown_schedule = False

    def show(record: dict) -> None:
        nonlocal shown_schedule
        if not shown_schedule and (schedule := run.schedule()):
            paths = {(r["origin"], tuple(r["stages"])) for r in schedule["routes"]}
            click.echo(f"schedule epoch {schedule['epoch']}: {len(schedule['placement'])} peers, "
                       f"{len(schedule['routes'])} microbatches, {len(paths)} distinct stage paths")
            shown_schedule = True
        total = f"/{iterations}" if iterations else ""
        click.echo(f"iteration {record['iteration']}{total}  loss {record['loss']:.4f}  "
                   f"{record['tokens_per_s'] or 0:,.0f} tokens/s  {record['iteration_seconds']:.2f} s  "
                   f"{record['peers_online']} peers  epoch {record['epoch']}")

    try:
        run.start()
        run.watch(iterations or 10**12, metrics_path=metrics, on_record=show)
    except KeyboardInterrupt:
        click.echo("stopping...")
    except (RuntimeError, TimeoutError) as e:
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1) from None
    finally:
        run.stop()
    click.echo("all processes stopped")
