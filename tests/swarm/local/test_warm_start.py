"""The warm starter forks `skippipe-peer` processes with their own arguments, environment and output, reports how
they ended, refuses a malformed request without stopping, and leaves nothing behind when stopped (the swarm conftest
fails a test that leaks a process)."""

from __future__ import annotations

import os

import pytest

from swarm.local.warm_start import WarmStarter

pytestmark = pytest.mark.timeout(180)

PEER = "/ip4/127.0.0.1/tcp/1/p2p/QmYicVwnxLG1JECbJzzPTP5WJ6DyMDYDBecK5jywMayxBt"


@pytest.fixture(scope="module")
def starter(tmp_path_factory):
    s = WarmStarter(log=tmp_path_factory.mktemp("starter") / "warm-starter.log")
    try:
        yield s
    finally:
        s.stop()


def test_a_forked_peer_runs_with_its_own_arguments_environment_and_output(starter, tmp_path):
    bad_stage = starter.spawn(["join", "--initial-peers", PEER, "--stage", "first"], dict(os.environ),
                              tmp_path / "stage.out")
    assert bad_stage.pid != starter.proc.pid
    assert bad_stage.wait(timeout=60) == 2 and bad_stage.poll() == 2
    assert "--stage must be a stage number or auto, got 'first'" in (tmp_path / "stage.out").read_text()
    # the token comes from the environment given with the request, not from the starter's
    bad_token = starter.spawn(["join", "--initial-peers", PEER], {**os.environ, "SKIPPIPE_JOIN_TOKEN": "short"},
                              tmp_path / "token.out")
    assert bad_token.wait(timeout=60) == 2
    assert "a join token is 16-" in (tmp_path / "token.out").read_text()
    assert "join token" not in (tmp_path / "stage.out").read_text()


def test_a_malformed_request_is_refused_and_the_starter_keeps_serving(starter, tmp_path):
    assert "bad request" in starter.request({"argv": "join"})["error"]  # what a broken launcher might write
    again = starter.spawn(["join", "--initial-peers", PEER, "--stage", "x"], dict(os.environ), tmp_path / "x.out")
    assert again.wait(timeout=60) == 2


def test_stopping_the_starter_ends_it(tmp_path):
    s = WarmStarter(log=tmp_path / "warm-starter.log")
    done = s.spawn(["join", "--initial-peers", PEER, "--stage", "x"], dict(os.environ), tmp_path / "x.out")
    assert done.wait(timeout=120) == 2
    s.stop()
    assert s.proc.returncode == 0
    assert "Traceback" not in (tmp_path / "warm-starter.log").read_text()
