"""`skippipe monitor`: watch a run live from outside it, in the terminal, as JSON, or as a web page."""

from __future__ import annotations

import json
import logging
import sys

import click

from swarm.cli.run import _fail
from swarm.cli.stop_signal import stop_event


@click.command("monitor")
@click.option("--initial-peers", multiple=True, required=True, help="multiaddr of the coordinator or any peer")
@click.option("--run", "run_id", required=True, help="run id to watch")
@click.option("--coordinator", default=None,
              help="peer id whose run spec is trusted (default: the /p2p/ id of the first --initial-peers)")
@click.option("--once", is_flag=True, help="print one snapshot and exit")
@click.option("--json", "as_json", is_flag=True, help="print snapshots as JSON (one object per line)")
@click.option("--listen", type=click.FloatRange(0, 600), default=5.0, show_default=True,
              help="with --once: seconds to listen to the run's gossip for iteration progress first")
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=2.0, show_default=True,
              help="seconds between refreshes")
@click.option("--http", "http_port", type=click.IntRange(0, 65535), default=None,
              help="serve the live page on this port (0 = any free port)")
@click.option("--http-host", default="127.0.0.1", show_default=True, help="address the page is served on")
@click.option("--host", default="127.0.0.1", show_default=True, help="address the gossip listener binds")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="WARNING")
def monitor(initial_peers, run_id, coordinator, once, as_json, listen, interval, http_port, http_host, host,
            log_level) -> None:
    """Show a run's peers, stage groups, schedule and progress, from what the run publishes (read-only)."""
    from swarm.monitor.observer import SwarmObserver
    from swarm.monitor.snapshot import json_ready
    from swarm.monitor.terminal import render_text
    from swarm.peer.options import trusted_coordinator

    logging.basicConfig(level=getattr(logging, log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(logging.ERROR)
    if once and http_port is not None:
        _fail("--once prints one snapshot; --http serves a live page: choose one")
    try:
        coordinator = trusted_coordinator(tuple(initial_peers), coordinator)
    except ValueError as e:
        _fail(str(e))
    stop = stop_event()
    observer = SwarmObserver(initial_peers, run_id, coordinator=coordinator, interval=interval, host=host)
    server = None
    try:
        try:
            observer.start()
        except TimeoutError as e:
            _fail(str(e))
        except Exception as e:  # an address that does not answer, say: one line, not hivemind's traceback
            _fail(f"cannot join the run's DHT through {initial_peers[0]}: {e}")
        if once:
            stop.wait(listen)
            observer.wait_for_reads(1, timeout=30)
            _show(observer.snapshot(), as_json, render_text, json_ready, clear=False)
            return
        if http_port is not None:
            from swarm.monitor.web import MonitorServer

            server = MonitorServer(observer.snapshot, host=http_host, port=http_port).start()
            click.echo(f"monitor page: {server.url}", err=True)
        clear = sys.stdout.isatty() and not as_json
        while not stop.is_set():
            if http_port is None or as_json:
                _show(observer.snapshot(), as_json, render_text, json_ready, clear=clear)
            stop.wait(interval)
    finally:
        if server is not None:
            server.stop()
        observer.stop()


def _show(snapshot: dict, as_json: bool, render_text, json_ready, *, clear: bool) -> None:
    if as_json:
        click.echo(json.dumps(json_ready(snapshot), allow_nan=False, default=str))
    else:
        click.echo(("\033[H\033[2J" if clear else "") + render_text(snapshot))
