"""Gathering peers' own stage checkpoints: the newest common iteration, bit-exact against the in-process swarm's
whole checkpoint at that iteration, the majority taken when peers of a stage disagree, and eval / export-hf of the
result (transformers gives our logits)."""

import dataclasses
import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from peers_util import MICRO
from safetensors.torch import load_file

from peers.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model,
    resolve_checkpoint,
    save_checkpoint,
    save_stage_checkpoint,
)
from peers.checkpoint_gather import gather_checkpoint
from peers.data import Corpus, DataConfig
from peers.inprocess import InProcessSwarm, simple_schedule
from peers.optim import OptimConfig
from peers.worker import StageWorker
from tests.utils.hf_llama import VOCAB, write_docs, write_tokenizer

OPTIM = OptimConfig(lr=3e-3, warmup_steps=1, total_steps=10)
SEED = 4


def _cli(*args):
    from swarm.cli.main import main

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 6-peer, 3-stage swarm trained 2 iterations; each peer saved its stage into its own root at iteration 1,
    the peers of stages 0 and 1 again at 2 (stage 2 only has 1); whole checkpoints of the swarm at 1 and 2."""
    base = tmp_path_factory.mktemp("gather")
    tok = base / "tok" / "tokenizer.json"
    tok.parent.mkdir()
    write_tokenizer(tok)
    (tok.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "bos_token": "<s>"}))
    corpus = Corpus.build(DataConfig(paths=(str(write_docs(base / "docs.txt")),), tokenizer=str(tok), seq_len=8,
                                     batch_size=2))
    cfg = dataclasses.replace(MICRO, vocab_size=VOCAB)
    swarm = InProcessSwarm(simple_schedule(6, 3, 0.0, microbatches_per_holder=1), cfg, OPTIM, corpus=corpus,
                           seed=SEED)
    data = corpus.config.to_dict()

    def save_peers(stages):
        for peer, w in swarm.workers.items():
            if w.stage in stages:
                save_stage_checkpoint(base / "peers" / peer, w, iteration=swarm.iteration, seed=SEED,
                                      extra={"run_id": "r1", "peer": peer, "epoch": 0, "data": data})

    for it, stages in ((1, (0, 1, 2)), (2, (0, 1))):
        swarm.run_iteration()
        save_peers(stages)
        save_checkpoint(base / f"whole-{it}", swarm)
    return base, swarm


def _same_weights(a, b, stages=3):
    (da, ma), (db, mb) = resolve_checkpoint(a), resolve_checkpoint(b)
    for s in range(stages):
        name = f"stage-{s}.safetensors"
        assert ma["files"][name] == mb["files"][name], name  # the same bytes
        ta, tb = load_file(str(da / name)), load_file(str(db / name))
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_gather_picks_the_newest_common_iteration_bit_exactly(run, tmp_path):
    base, swarm = run
    peers = sorted((base / "peers").iterdir())
    assert len(peers) == 6 and all(len(list(p.glob("step-*"))) == (2 if i < 4 else 1) for i, p in enumerate(peers))
    result = gather_checkpoint(peers, tmp_path / "g")
    assert result.iteration == 1 and not result.warnings and result.optimizer and result.tokenizer
    assert {s: c.step_dir.parent.name for s, c in result.sources.items()} == {0: "peer-00", 1: "peer-02",
                                                                              2: "peer-04"}
    assert result.agreeing == {0: (2, 2), 1: (2, 2), 2: (2, 2)}
    _same_weights(tmp_path / "g", base / "whole-1")
    ma, mb = resolve_checkpoint(tmp_path / "g")[1], resolve_checkpoint(base / "whole-1")[1]
    for s in range(3):  # optimizer moments too
        name = f"stage-{s}-optimizer.safetensors"
        assert ma["files"][name] == mb["files"][name]
    assert (ma["iteration"], ma["steps"], ma["seed"], ma["split"]) == (1, 1, SEED, list(swarm.split))

    # weights and optimizer load back into a swarm (no data positions: an exact resume of the run is refused)
    model, _ = load_model(tmp_path / "g")
    ref, _ = load_model(base / "whole-1")
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in model.state_dict().items())
    with pytest.raises(CheckpointError, match="data positions"):
        load_checkpoint(tmp_path / "g", swarm)

    # the peers of stage 2 save iteration 2 as well: now 2 is common; a directory holding the roots works too
    shutil.copytree(base / "peers", tmp_path / "peers")
    for peer in ("peer-04", "peer-05"):
        save_stage_checkpoint(tmp_path / "peers" / peer, swarm.workers[peer], iteration=2, seed=SEED,
                              extra={"run_id": "r1", "peer": peer, "epoch": 0, "data": ma["data"]})
    result = gather_checkpoint([tmp_path / "peers"], tmp_path / "g2")
    assert result.iteration == 2
    _same_weights(tmp_path / "g2", base / "whole-2")


def test_disagreeing_peers_of_a_stage_the_majority_is_taken(run, tmp_path):
    base, swarm = run
    odd = StageWorker("peer-x", 1, swarm.model_config, swarm.split, OPTIM, seed=99)
    save_stage_checkpoint(tmp_path / "peer-x", odd, iteration=1, seed=SEED,
                          extra={"run_id": "r1", "peer": "peer-x", "epoch": 0,
                                 "data": swarm.corpus.config.to_dict()})
    result = gather_checkpoint([tmp_path / "peer-x", base / "peers"], tmp_path / "g")
    assert result.iteration == 1 and result.agreeing[1] == (2, 3)
    assert result.sources[1].manifest["peer"] in ("peer-02", "peer-03")
    assert len(result.warnings) == 1 and "stage 1" in result.warnings[0] and "most of them agree" in \
        result.warnings[0] and str(tmp_path / "peer-x") in result.warnings[0]
    _same_weights(tmp_path / "g", base / "whole-1")


def test_eval_and_export_hf_of_the_peer_checkpoints(run, tmp_path):
    transformers = pytest.importorskip("transformers")
    base, _ = run
    r = _cli("gather", base / "peers", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.output
    assert "gathered iteration 1 of 3 stages" in r.output and "stage 2: " in r.output and "2 of 2 agree" in r.output
    r = _cli("eval", tmp_path / "g", "--batches", "1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["iteration"] == 1

    r = _cli("export-hf", *sorted((base / "peers").iterdir()), "-o", tmp_path / "hf")  # gathered on the way
    assert r.exit_code == 0, r.output
    assert "gathered iteration 1" in r.output and "exported" in r.output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the temporary one is gone
    ours, _ = load_model(tmp_path / "g")
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(ours.eval()(tokens), theirs(tokens).logits, atol=1e-4, rtol=0)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token == "</s>"


def test_without_a_tokenizer_file_the_runs_bpe_is_rebuilt_from_its_corpus(tmp_path):
    """A run on the bundled corpus with a trained BPE (data.tokenizer unset): gather stores the same tokenizer."""
    data = DataConfig(vocab_size=300, seq_len=8, batch_size=2)
    cfg = dataclasses.replace(MICRO, vocab_size=300)
    for stage in range(2):
        save_stage_checkpoint(tmp_path / f"p{stage}", StageWorker(f"p{stage}", stage, cfg, (2, 2), OPTIM),
                              iteration=1, seed=0, extra={"data": data.to_dict()})
    result = gather_checkpoint([tmp_path / "p0", tmp_path / "p1"], tmp_path / "g")
    assert result.tokenizer and not result.warnings
    step = result.manifest_path.parent
    assert (step / "tokenizer.json").read_text() == Corpus.build(data).tokenizer.to_str()
    r = _cli("eval", tmp_path / "g", "--batches", "1", "--json")
    assert r.exit_code == 0, r.output
