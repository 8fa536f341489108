import dataclasses
import json

import pytest
import torch
from peers_util import MICRO

from peers.checkpoint import (
    CheckpointError,
    has_checkpoint,
    load_checkpoint,
    load_model,
    load_stage_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    save_stage_checkpoint,
)
from peers.data import Corpus, DataConfig
from peers.evaluate import evaluate
from peers.inprocess import InProcessSwarm, simple_schedule
from peers.optim import OptimConfig
from peers.worker import StageWorker

OPTIM = OptimConfig(lr=3e-3, warmup_steps=2, total_steps=10)
SPLIT = (2, 1, 1)


@pytest.fixture(scope="module")
def corpus():
    return Corpus.build(DataConfig(vocab_size=300, seq_len=16, batch_size=2))


def make_swarm(corpus, **model_changes):
    cfg = dataclasses.replace(MICRO, vocab_size=corpus.vocab_size, **model_changes)
    return InProcessSwarm(simple_schedule(5, 3, 1 / 3, microbatches_per_holder=2), cfg, OPTIM, corpus=corpus,
                          seed=1)


def test_exact_resume(tmp_path, corpus):
    a = make_swarm(corpus)
    for _ in range(2):
        a.run_iteration()
    save_checkpoint(tmp_path / "ck", a)
    tail_a = [a.run_iteration().loss for _ in range(2)]

    b = make_swarm(corpus)
    manifest = load_checkpoint(tmp_path / "ck", b)
    assert manifest["iteration"] == 2 and b.iteration == 2
    tail_b = [b.run_iteration().loss for _ in range(2)]
    assert tail_a == tail_b, "a resumed run must continue bit for bit"
    for k, v in a.full_model().state_dict().items():
        assert torch.equal(v, b.full_model().state_dict()[k]), k

    model, _ = load_model(tmp_path / "ck")
    assert evaluate(model, corpus.validation_batches(2), a.split).perplexity > 1


def test_corrupted_or_mismatched_checkpoint_is_refused(tmp_path, corpus):
    a = make_swarm(corpus)
    a.run_iteration()
    root = tmp_path / "ck"
    ck = save_checkpoint(root, a).parent

    with pytest.raises(CheckpointError, match="model.dim"):
        load_checkpoint(ck, make_swarm(corpus, dim=32))
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load_checkpoint(tmp_path / "nothing", make_swarm(corpus))

    data = bytearray((ck / "stage-1.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (ck / "stage-1.safetensors").write_bytes(bytes(data))
    fresh = make_swarm(corpus)
    before = {k: v.clone() for k, v in fresh.full_model().state_dict().items()}
    with pytest.raises(CheckpointError, match="stage-1.safetensors is corrupted"):
        load_checkpoint(root, fresh)
    assert all(torch.equal(v, fresh.full_model().state_dict()[k]) for k, v in before.items()), \
        "a refused checkpoint must not be half-loaded"

    manifest = json.loads((ck / "checkpoint.json").read_text())
    (ck / "checkpoint.json").write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(CheckpointError, match="format 99"):
        load_model(root)
    (ck / "checkpoint.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupted"):
        load_model(root)


def test_checkpoint_holds_no_pickle(tmp_path, corpus):
    a = make_swarm(corpus)
    save_checkpoint(tmp_path / "ck", a)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "step-00000000"]
    names = sorted(p.name for p in (tmp_path / "ck" / "step-00000000").iterdir())
    assert names == ["checkpoint.json", "rng.safetensors", "stage-0-optimizer.safetensors", "stage-0.safetensors",
                     "stage-1-optimizer.safetensors", "stage-1.safetensors", "stage-2-optimizer.safetensors",
                     "stage-2.safetensors", "tokenizer.json"]


def test_each_save_is_a_step_directory_and_the_previous_one_is_kept(tmp_path, corpus):
    a = make_swarm(corpus)
    root = tmp_path / "ck"
    for _ in range(3):
        a.run_iteration()
        assert save_checkpoint(root, a) == root / f"step-{a.iteration:08d}" / "checkpoint.json"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000003"]
    assert (root / "latest").read_text() == "step-00000003\n"
    assert resolve_checkpoint(root)[0] == root / "step-00000003"

    save_checkpoint(root, a)  # the same iteration again: a new directory, never the current one overwritten
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000003", "step-00000003-1"]
    assert resolve_checkpoint(root)[0] == root / "step-00000003-1"
    assert load_checkpoint(root, make_swarm(corpus))["iteration"] == 3


def test_an_incomplete_latest_falls_back_to_the_previous_checkpoint(tmp_path, corpus, caplog):
    a = make_swarm(corpus)
    root = tmp_path / "ck"
    a.run_iteration()
    save_checkpoint(root, a)
    a.run_iteration()
    newest = save_checkpoint(root, a).parent
    (newest / "stage-2-optimizer.safetensors").unlink()
    b = make_swarm(corpus)
    assert load_checkpoint(root, b)["iteration"] == 1 and b.iteration == 1
    assert "loading step-00000001 instead" in caplog.text
    (root / "latest").unlink()  # no pointer at all: the newest complete step directory
    assert resolve_checkpoint(root)[0] == root / "step-00000001"


def test_a_crash_before_the_pointer_switch_keeps_the_old_checkpoint(tmp_path, corpus, monkeypatch):
    a = make_swarm(corpus)
    root = tmp_path / "ck"
    a.run_iteration()
    save_checkpoint(root, a)
    a.run_iteration()

    def crash(*args):
        raise OSError("power lost")

    monkeypatch.setattr("peers.checkpoint.os.replace", crash)
    with pytest.raises(OSError, match="power lost"):
        save_checkpoint(root, a)
    monkeypatch.undo()
    assert load_checkpoint(root, make_swarm(corpus))["iteration"] == 1
    a.run_iteration()
    save_checkpoint(root, a)  # the next save tidies up: the current and the previous step directory
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000001", "step-00000003"]


def test_the_flat_layout_of_older_builds_still_loads(tmp_path, corpus):
    a = make_swarm(corpus)
    a.run_iteration()
    step = save_checkpoint(tmp_path / "ck", a).parent
    flat = tmp_path / "flat"
    step.rename(flat)
    assert has_checkpoint(flat) and not has_checkpoint(tmp_path / "nothing")
    assert load_checkpoint(flat, make_swarm(corpus))["iteration"] == 1


def stage_worker(stage: int, fill: float | None = None) -> StageWorker:
    w = StageWorker("p", stage, MICRO, SPLIT, OptimConfig(grad_clip=0))
    if fill is not None:
        with torch.no_grad():
            for p in w.module.parameters():
                p.fill_(fill)
    return w


def test_stage_checkpoint_round_trip_and_fallback(tmp_path):
    root = tmp_path / "peer"
    for it in (2, 4):
        save_stage_checkpoint(root, stage_worker(1, fill=it), iteration=it, seed=0, extra={"peer": "p"})
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000004"]
    w = stage_worker(1)
    manifest = load_stage_checkpoint(root, w)
    assert manifest["iteration"] == 4 and manifest["peer"] == "p"
    assert all(torch.all(p == 4) for p in w.module.parameters())

    (root / "step-00000004" / "peer.json").write_text("{torn")
    assert load_stage_checkpoint(root, w)["iteration"] == 2
    assert all(torch.all(p == 2) for p in w.module.parameters())
    with pytest.raises(CheckpointError, match="stage=1"):
        load_stage_checkpoint(root, stage_worker(2))
    (root / "step-00000002" / "peer.json").unlink()
    with pytest.raises(CheckpointError, match="corrupted.*no earlier complete checkpoint"):
        load_stage_checkpoint(root, w)
