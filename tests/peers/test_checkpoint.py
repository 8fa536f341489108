import dataclasses
import json

import pytest
import torch
from peers_util import MICRO

from peers.checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from peers.data import Corpus, DataConfig
from peers.evaluate import evaluate
from peers.inprocess import InProcessSwarm, simple_schedule
from peers.optim import OptimConfig

OPTIM = OptimConfig(lr=3e-3, warmup_steps=2, total_steps=10)


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
    ck = tmp_path / "ck"
    save_checkpoint(ck, a)

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
        load_checkpoint(ck, fresh)
    assert all(torch.equal(v, fresh.full_model().state_dict()[k]) for k, v in before.items()), \
        "a refused checkpoint must not be half-loaded"

    manifest = json.loads((ck / "checkpoint.json").read_text())
    (ck / "checkpoint.json").write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(CheckpointError, match="format 99"):
        load_model(ck)
    (ck / "checkpoint.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupted"):
        load_model(ck)


def test_checkpoint_holds_no_pickle(tmp_path, corpus):
    a = make_swarm(corpus)
    save_checkpoint(tmp_path / "ck", a)
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == ["checkpoint.json", "rng.safetensors", "stage-0-optimizer.safetensors", "stage-0.safetensors",
                     "stage-1-optimizer.safetensors", "stage-1.safetensors", "stage-2-optimizer.safetensors",
                     "stage-2.safetensors", "tokenizer.json"]
