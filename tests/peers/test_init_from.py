"""Training from an imported Hugging Face Llama: the first iteration's loss is LlamaForCausalLM's on the same
batches, the trained checkpoint keeps the imported eos and exports back to transformers, and a peer whose copy of
the initial weights differs from the run's is refused."""

import json

import pytest
import torch
from click.testing import CliRunner

from peers.checkpoint import (
    CheckpointError,
    initial_weight_digests,
    load_initial_stage,
    load_initial_weights,
    load_model,
    resolve_checkpoint,
)
from peers.inprocess import InProcessSwarm, simple_schedule
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker
from tests.utils.hf_llama import write_hf_llama

transformers = pytest.importorskip("transformers")


def _cli(*args):
    from swarm.cli.main import main

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(HF model, checkpoint root of its 2-stage import)."""
    hf = tmp_path_factory.mktemp("hf")
    model = write_hf_llama(hf, tied=False)
    ckpt = tmp_path_factory.mktemp("import") / "ckpt"
    r = _cli("import-hf", hf, "-o", ckpt, "--stages", 2)
    assert r.exit_code == 0, r.output
    return model, ckpt


def test_the_first_iteration_trains_the_imported_model(imported):
    model, ckpt = imported
    cfg = ModelConfig.from_dict(resolve_checkpoint(ckpt)[1]["model"])
    schedule = simple_schedule(4, 2, 0.0, microbatches_per_holder=2)  # full pipeline: every batch sees every layer
    swarm = InProcessSwarm(schedule, cfg, OptimConfig(lr=1e-3, warmup_steps=1, total_steps=4), seed=7)
    load_initial_weights(ckpt, swarm)
    g = torch.Generator().manual_seed(0)
    batches = {r.microbatch: torch.randint(0, 280, (2, 17), generator=g) for r in schedule.routes}
    before = [p.detach().clone() for p in swarm.stage_workers(1)[0].module.parameters()]
    stats = swarm.run_iteration(batches)
    with torch.no_grad():
        expected = sum(model(b, labels=b).loss.item() for b in batches.values()) / len(batches)
    assert abs(stats.loss - expected) < 1e-4
    after = list(swarm.stage_workers(1)[0].module.parameters())
    assert all(w.steps == 1 for w in swarm.workers.values()) and swarm.iteration == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_swarm_inprocess_init_from_trains_and_exports_to_transformers(imported, tmp_path):
    _, ckpt = imported
    r = _cli("swarm", "inprocess", "--init-from", ckpt, "--peers", 3, "--iterations", 2, "--eval-every", 0,
             "--seq-len", 16, "--batch-size", 2, "--microbatches", 1, "--checkpoint", tmp_path / "run",
             "--metrics", tmp_path / "m.jsonl")
    assert r.exit_code == 0, r.output
    assert "starting from the weights of" in r.output and "ckpt" in r.output
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [rec["iteration"] for rec in records] == [1, 2] and records[0]["loss"] < 10

    step, manifest = resolve_checkpoint(tmp_path / "run")
    assert manifest["iteration"] == 2 and manifest["model"] == resolve_checkpoint(ckpt)[1]["model"]
    assert "tokenizer_config.json" in manifest["files"]  # the imported eos survives training
    assert json.loads((step / "tokenizer_config.json").read_text())["eos_token"] == "</s>"
    r = _cli("eval", tmp_path / "run", "--batches", 1, "--json")
    assert r.exit_code == 0, r.output

    assert _cli("export-hf", tmp_path / "run", "-o", tmp_path / "hf").exit_code == 0
    ours, _ = load_model(tmp_path / "run")
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, 280, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(ours.eval()(tokens), theirs(tokens).logits, atol=1e-4, rtol=0)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token == "</s>"


def test_init_from_refuses_a_model_choice_of_its_own(imported, tmp_path):
    _, ckpt = imported
    r = _cli("swarm", "inprocess", "--init-from", ckpt, "--model", "tiny", "--iterations", 1)
    assert r.exit_code == 2 and "drop --model" in r.output and "Traceback" not in r.output
    r = _cli("swarm", "inprocess", "--init-from", ckpt, "--stages", 3, "--iterations", 1)
    assert r.exit_code == 2 and "has 2 stages" in r.output


def test_a_peer_with_other_initial_weights_is_refused(imported, tmp_path):
    _, ckpt = imported
    cfg = ModelConfig.from_dict(resolve_checkpoint(ckpt)[1]["model"])
    digests = initial_weight_digests(ckpt, cfg, (2, 2))
    write_hf_llama(tmp_path / "other", tied=False, seed=5)  # the same architecture, other weights
    assert _cli("import-hf", tmp_path / "other", "-o", tmp_path / "ck2", "--stages", 2).exit_code == 0

    worker = StageWorker("p", 1, cfg, (2, 2), OptimConfig())
    load_initial_stage(ckpt, worker, digests[1])
    assert worker.steps == 0 and not worker.optimizer.state
    with pytest.raises(CheckpointError, match="is not this run's initial weights of stage 1"):
        load_initial_stage(tmp_path / "ck2", worker, digests[1])
    with pytest.raises(CheckpointError, match=r"split=\[2, 2\], this run has \[3, 1\]"):
        load_initial_stage(ckpt, StageWorker("p", 1, cfg, (3, 1), OptimConfig()))
    with pytest.raises(CheckpointError, match="model.dim=64, this run has 32"):
        initial_weight_digests(ckpt, ModelConfig(vocab_size=288, dim=32, n_layers=4, n_heads=4, ffn_dim=96), (2, 2))
