"""`skippipe gather` and `skippipe export-hf` of peer checkpoints refuse what cannot make one whole model with one
line and exit code 2, writing nothing."""

import dataclasses

import pytest
from click.testing import CliRunner

from peers.checkpoint import save_checkpoint, save_stage_checkpoint
from peers.inprocess import InProcessSwarm, simple_schedule
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker
from swarm.cli.main import main

MODEL = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (2, 1, 1)


def save(root, stage, iterations, *, model=MODEL, seed=0, run_id="r1"):
    w = StageWorker(f"p{stage}", stage, model, SPLIT, OptimConfig())
    for it in iterations:
        save_stage_checkpoint(root, w, iteration=it, seed=seed, extra={"run_id": run_id, "peer": root.name})
    return root


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(r, message):
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("command", ["gather", "export-hf"])
def test_refusals(tmp_path, command):
    a, b, c = save(tmp_path / "a", 0, [1, 2]), save(tmp_path / "b", 1, [1, 2]), save(tmp_path / "c", 2, [2])
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"

    refused(cli(command, a, tmp_path / "empty", "-o", out), f"no peer checkpoint in {tmp_path / 'empty'} (no step "
                                                            "directory with a peer.json)")
    refused(cli(command, a, b, "-o", out), "no checkpoint of stage 2 among the peer checkpoints given (found "
                                           "stage(s) 0, 1 of 3)")
    late = save(tmp_path / "late", 2, [3, 4])
    refused(cli(command, a, b, late, "-o", out), "no iteration is saved for every stage (stage 0: 1, 2; stage 1: "
                                                 "1, 2; stage 2: 3, 4)")
    other = save(tmp_path / "other", 2, [2], model=dataclasses.replace(MODEL, ffn_dim=48))
    refused(cli(command, a, b, other, "-o", out), "peer checkpoints of different runs: model.ffn_dim is 32 in")
    refused(cli(command, a, b, save(tmp_path / "seed", 2, [2], seed=7), "-o", out), "seed is 0 in")
    refused(cli(command, a, b, save(tmp_path / "run", 2, [2], run_id="r2"), "-o", out), "run_id is 'r1' in")
    assert not out.exists()

    out.mkdir()
    (out / "x").write_text("taken")
    refused(cli(command, a, b, c, "-o", out), f"output directory {out} exists and is not empty")


def test_gather_of_a_corrupted_newest_save_takes_the_common_older_one(tmp_path):
    save(tmp_path / "a", 0, [1, 2]), save(tmp_path / "b", 1, [1, 2])
    c = save(tmp_path / "c", 2, [1, 2])
    f = c / "step-00000002" / "stage-2.safetensors"
    f.write_bytes(f.read_bytes()[:-1] + b"!")
    r = cli("gather", tmp_path, "-o", tmp_path / "out")  # a directory holding the peer roots
    assert r.exit_code == 0, r.output
    assert "warning: skipped" in r.output and "stage-2.safetensors is corrupted" in r.output
    assert "gathered iteration 1 of 3 stages" in r.output and f"stage 2: {c / 'step-00000001'} (peer c)" in r.output
    assert "no tokenizer stored" in r.output

    f.unlink()
    (c / "step-00000001" / "peer.json").write_text("{torn")
    refused(cli("gather", c, "-o", tmp_path / "out2"), f"no complete peer checkpoint in {c}: skipped")


def test_gather_refuses_a_whole_checkpoint_and_export_hf_still_takes_one(tmp_path):
    swarm = InProcessSwarm(simple_schedule(3, 3, 0.0), MODEL, OptimConfig(), split=SPLIT)
    save_checkpoint(tmp_path / "whole", swarm)
    refused(cli("gather", tmp_path / "whole", "-o", tmp_path / "out"), "(it holds a whole-model checkpoint)")
    r = cli("export-hf", tmp_path / "whole", "-o", tmp_path / "hf")
    assert r.exit_code == 0 and "gathered" not in r.output and (tmp_path / "hf" / "config.json").is_file(), r.output


def test_gather_refuses_a_bad_tokenizer_file(tmp_path):
    roots = [save(tmp_path / "a", 0, [1]), save(tmp_path / "b", 1, [1]), save(tmp_path / "c", 2, [1])]
    (tmp_path / "tok.json").write_text("{not a tokenizer")
    refused(cli("gather", *roots, "--tokenizer", tmp_path / "tok.json", "-o", tmp_path / "out"),
            f"tokenizer file {tmp_path / 'tok.json'} could not be read")
    assert not (tmp_path / "out").exists()
