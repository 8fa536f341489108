"""End to end: a networked run started from an imported Hugging Face Llama. The coordinator reads the checkpoint
(model, stages, tokenizer, per-stage digests in the signed run spec), each peer starts its stage from its own
--init-from copy, and a volunteer whose copy differs is refused on joining with one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from swarm.local.local_swarm import LocalSwarm
from tests.utils.hf_llama import write_hf_llama

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _import(tmp_path, name: str, seed: int):
    from swarm.cli.main import main

    write_hf_llama(tmp_path / f"hf-{name}", tied=False, seed=seed)
    r = CliRunner().invoke(main, ["import-hf", str(tmp_path / f"hf-{name}"), "-o", str(tmp_path / name),
                                  "--stages", "2"])
    assert r.exit_code == 0, r.output
    return tmp_path / name


def test_peers_start_from_their_copies_of_the_imported_weights(tmp_path):
    ckpt, other = _import(tmp_path, "ckpt", 2), _import(tmp_path, "other", 5)
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\ninit_from = "{ckpt}"\nskip = 0.0\nmicrobatches = 1\n\n'
                      "[data]\nseq_len = 16\nbatch_size = 2\n")
    run = LocalSwarm(tmp_path / "run", 3, run_id="init-from",
                     coordinator_args=["--config", str(config), "--iterations", "2", "--min-peers", "2"],
                     peer_args=[["--init-from", str(ckpt)], ["--init-from", str(ckpt)], ["--init-from", str(other)]])
    try:
        run.start()
        stranger = run.peers[2]
        assert stranger.wait(timeout=90) == 2
        told = (run.run_dir / "peer-02.out").read_text()
        assert "stage-0.safetensors is not this run's initial weights" in told and "Traceback" not in told, told
        run.peers.remove(stranger)
        records = run.watch(2, timeout=120)
        assert [r["iteration"] for r in records[:2]] == [1, 2]
        loaded = {e["stage"] for e in run.events("stage_loaded", who="peer-*") if e.get("source") == "init_from"}
        assert loaded == {0, 1}
    finally:
        run.stop()
    assert not [p.pid for p in run.processes if p.poll() is None]
