"""The runtime's commands refuse bad input with one line and a non-zero exit, before starting anything."""

import os

import pytest
from click.testing import CliRunner

from swarm.cli.main import main, peer_main


@pytest.mark.parametrize("args, message", [
    (["coordinator", "start", "--stages", "0"], "run.stages must be an integer >= 1"),
    (["coordinator", "start", "--skip", "1.5"], "run.skip must be in [0, 1)"),
    (["coordinator", "start", "--stages", "9"], "tiny has 6 layers"),
    (["coordinator", "start", "--run-id", "a/b"], "run.run_id"),
    (["coordinator", "start", "--stages", "2", "--skip", "0.33"], "no path can visit stage(s) 1,"),
])
def test_coordinator_refuses_bad_flags(args, message):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("content, message", [
    ("[run]\nstages = 'three'", "run.stages must be an integer"),
    ("[run]\nmodel = 'huge'", "run.model must be one of"),
    ("[run]\nbogus = 1", "unknown field run.bogus"),
    ("[optim]\nlr = -1", "lr"),
    ("optim = 3", "[optim] must be a table"),
    ("[data]\nseq_len = 100000", "data.seq_len"),
    ("not toml [", "not valid TOML"),
    ("[swarm]\nrebalance = 'yes'", "swarm.rebalance must be true or false"),
    ("[swarm]\nholder_shares = 1", "swarm.holder_shares must be true or false"),
    ("[swarm]\nmeasured_speeds = 'no'", "swarm.measured_speeds must be true or false"),
    ("[swarm]\nbench_seconds = -5", "swarm.bench_seconds must be 0-86400 seconds"),
    ("[swarm]\nbench_seconds = true", "swarm.bench_seconds must be 0-86400 seconds"),
])
def test_coordinator_refuses_bad_config_files(tmp_path, content, message):
    f = tmp_path / "run.toml"
    f.write_text(content)
    r = CliRunner().invoke(main, ["coordinator", "start", "--config", str(f)])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_a_relaying_coordinator_refuses_hivemind_averaging(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[swarm]\naveraging = 'hivemind'\n")
    r = CliRunner().invoke(main, ["coordinator", "start", "--config", str(f), "--relay"])
    assert r.exit_code == 2 and "the relay does not carry" in r.output and "Traceback" not in r.output


def test_peer_refuses_a_bad_stage():
    r = CliRunner().invoke(peer_main, ["join", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--stage", "first"])
    assert r.exit_code == 2 and "--stage must be a stage number or auto" in r.output


@pytest.mark.parametrize("value", ["0", "-5", "nan", "soon"])
def test_peer_refuses_a_bad_join_timeout(value):
    r = CliRunner().invoke(peer_main, ["join", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--join-timeout", value])
    assert r.exit_code == 2 and "--join-timeout" in r.output


@pytest.mark.parametrize("args, message", [
    (["--emulate-drift", "2"], "--emulate-drift slows an emulated device: it needs --emulate-speed"),
    (["--emulate-speed", "0.1", "--emulate-drift", "0.5"], "--emulate-drift"),
    (["--emulate-speed", "0.1", "--emulate-drift", "nan"], "--emulate-drift must be a number"),
])
def test_peer_refuses_a_drift_it_cannot_emulate(args, message):
    r = CliRunner().invoke(peer_main, ["join", "--initial-peers", "/ip4/127.0.0.1/tcp/1", *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_local_swarm_refuses_a_bad_config():
    r = CliRunner().invoke(main, ["swarm", "local", "--peers", "3", "--stages", "0"])
    assert r.exit_code == 2 and "run.stages" in r.output


@pytest.mark.parametrize("content, message", [
    ("not json", "schedule is not valid JSON"),
    ('{"version": 99}', "format version 99 is not supported"),
])
def test_coordinator_refuses_a_bad_saved_plan(tmp_path, content, message):
    f = tmp_path / "schedule-0.json"
    f.write_text(content)
    r = CliRunner().invoke(main, ["coordinator", "start", "--first-schedule", str(f)])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_coordinator_refuses_a_saved_plan_of_another_shape(tmp_path):
    from scheduler.planner import plan_for_profile

    f = tmp_path / "schedule-0.json"
    f.write_text(plan_for_profile(num_peers=6, num_stages=2, skip=0.0).to_json())
    r = CliRunner().invoke(main, ["coordinator", "start", "--stages", "3", "--first-schedule", str(f)])
    assert r.exit_code == 2 and "cannot start this run: it has 2 stages, the run 3" in r.output


def test_an_identity_another_process_holds_is_refused_in_one_line(tmp_path):
    from swarm.net.identity import ensure_identity
    from swarm.net.identity_lock import claim_identity

    key = tmp_path / "peer.key"
    coordinator_id = ensure_identity(str(tmp_path / "coordinator.key"))
    _, lock = claim_identity(key)  # as a peer already running with it would
    try:
        for cli, args in ((main, ["coordinator", "start"]),
                          (peer_main, ["join", "--initial-peers", f"/ip4/127.0.0.1/tcp/1/p2p/{coordinator_id}"])):
            r = CliRunner().invoke(cli, [*args, "--identity", str(key)])
            assert r.exit_code == 2 and "Traceback" not in r.output
            assert r.output.strip() == f"error: identity {key} is in use by process {os.getpid()} on this machine " \
                                       "(one key is one peer): pass a different --identity FILE"
    finally:
        lock.release()


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"join_token": 7}', '{"join_token": "short"}'])
def test_a_coordinator_will_not_replace_a_join_token_it_cannot_read(tmp_path, content):
    """Its peers hold the run's token: with a new one the DHT would refuse their records, so a run directory whose
    token cannot be read is a one-line error, before anything starts, not a silent new token."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "coordinator.json").write_text(content)
    r = CliRunner().invoke(main, ["coordinator", "start", "--run-dir", str(run_dir),
                                  "--identity", str(tmp_path / "identity.key")])
    assert r.exit_code == 2 and "cannot read the run's join token" in r.output and "Traceback" not in r.output
