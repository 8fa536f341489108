"""Hugging Face Llama import/export: the imported stages run in order give LlamaForCausalLM's logits, export then
import is bit-exact and loads in transformers, and directories that are not plain Llamas are refused in one line."""

import json
import shutil
import tomllib
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from peers.checkpoint import resolve_checkpoint
from peers.model import ModelConfig
from peers.stage import build_stage
from tests.utils.hf_llama import write_docs, write_hf_llama

transformers = pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """{tied: (directory, model)}: tied single-file, untied sharded (with an index)."""
    out = {}
    for tied, shard in ((True, None), (False, "40KB")):
        d = tmp_path_factory.mktemp("tied" if tied else "untied")
        out[tied] = (d, write_hf_llama(d, tied=tied, shard=shard))
    assert (out[False][0] / "model.safetensors.index.json").is_file()
    return out


def _cli(*args: str):
    from swarm.cli.main import main

    return CliRunner().invoke(main, [str(a) for a in args])


def _stage_logits(ckpt: Path, tokens: torch.Tensor) -> torch.Tensor:
    """Our model run as its stages, each built alone from its own file: stage 0 embeds, 1..S-1 in order, 0's head."""
    step, manifest = resolve_checkpoint(ckpt)
    cfg, split = ModelConfig.from_dict(manifest["model"]), manifest["split"]
    stages = []
    for s in range(len(split)):
        module = build_stage(cfg, split, s)
        module.load_state_dict(load_file(str(step / f"stage-{s}.safetensors")), strict=True)
        stages.append(module.eval())
    with torch.no_grad():
        h = stages[0].embed(tokens)
        for module in stages:
            h = module.run_layers(h)
        return stages[0].logits(h)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("stages", [2, 3])
def test_imported_stages_give_transformers_logits(hf_dirs, tmp_path, tied, stages):
    src, model = hf_dirs[tied]
    r = _cli("import-hf", src, "-o", tmp_path / "ckpt", "--stages", stages)
    assert r.exit_code == 0, r.output
    tokens = torch.randint(0, 288, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(tokens).logits
    assert torch.allclose(_stage_logits(tmp_path / "ckpt", tokens), expected, atol=1e-4, rtol=0)

    _, manifest = resolve_checkpoint(tmp_path / "ckpt")
    cfg = ModelConfig.from_dict(manifest["model"])
    assert (cfg.n_kv_heads, cfg.tie_embeddings, cfg.rope_theta, cfg.norm_eps, cfg.ffn_dim) == (2, tied, 5000.0,
                                                                                             1e-6, 96)
    assert len(manifest["split"]) == stages and manifest["imported_from"]["eos_token_id"] == 2
    run = tomllib.loads((tmp_path / "ckpt" / "run.toml").read_text())
    assert ModelConfig.from_dict(run["model"]) == cfg and run["run"]["stages"] == stages


def test_export_round_trips_bit_exactly_and_loads_in_transformers(hf_dirs, tmp_path):
    src, model = hf_dirs[False]
    assert _cli("import-hf", src, "-o", tmp_path / "a", "--stages", 3).exit_code == 0
    r = _cli("export-hf", tmp_path / "a", "-o", tmp_path / "hf", "--max-shard-size", "64KB")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["eos_token_id"] == 2

    assert _cli("import-hf", tmp_path / "hf", "-o", tmp_path / "b", "--stages", 3).exit_code == 0
    for s in range(3):
        a = load_file(str(resolve_checkpoint(tmp_path / "a")[0] / f"stage-{s}.safetensors"))
        b = load_file(str(resolve_checkpoint(tmp_path / "b")[0] / f"stage-{s}.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)

    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, 288, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, model(tokens).logits)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.eos_token == "</s>" and tok.bos_token == "<s>"


def test_tied_export_has_no_head_and_eval_runs_on_the_import(hf_dirs, tmp_path):
    src, model = hf_dirs[True]
    assert _cli("import-hf", src, "-o", tmp_path / "a", "--stages", 2).exit_code == 0
    r = _cli("eval", tmp_path / "a", "--batches", "1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["perplexity"] > 1
    assert _cli("export-hf", tmp_path / "a", "-o", tmp_path / "hf").exit_code == 0
    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert "lm_head.weight" not in weights and len(weights) == len(model.state_dict()) - 1


def _broken(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    if how == "architecture":
        cfg["model_type"], cfg["architectures"] = "mistral", ["MistralForCausalLM"]
    elif how == "shape":
        cfg["intermediate_size"] = 128
    elif how == "rope_scaling":
        cfg["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}
    elif how == "missing_key":
        del cfg["hidden_size"]
    elif how == "missing_shard":
        shard = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
        (dst / shard).unlink()
    elif how == "dtype":
        from safetensors.torch import save_file

        shard = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
        tensors = load_file(str(dst / shard))
        tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int8)
        save_file(tensors, str(dst / shard), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("how, message", [
    ("architecture", "is not a Llama checkpoint: model_type is 'mistral'"),
    ("missing_shard", "is missing from"),
    ("shape", "has shape [96, 64], config.json implies [128, 64]"),
    ("rope_scaling", "rope_parameters 'linear' is not supported"),
    ("missing_key", "has no 'hidden_size'"),
    ("dtype", "model.norm.weight has dtype I8; only float weights"),
])
def test_refuses_what_is_not_a_plain_llama(hf_dirs, tmp_path, how, message):
    src = _broken(hf_dirs[False][0], tmp_path / "hf", how)
    r = _cli("import-hf", src, "-o", tmp_path / "ckpt", "--stages", 2)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "ckpt").exists()


def test_a_trained_gqa_tied_swarm_exports_to_transformers(tmp_path):
    """Our own layout (interleaved rotary pairs) trained a step in a swarm, saved, exported: transformers agrees."""
    from peers_util import random_batches

    from peers.checkpoint import load_model, save_checkpoint
    from peers.inprocess import InProcessSwarm, simple_schedule
    from peers.optim import OptimConfig

    cfg = ModelConfig(vocab_size=96, dim=32, n_layers=3, n_heads=4, ffn_dim=48, max_seq_len=32, rope_theta=500.0,
                      n_kv_heads=2, tie_embeddings=True)
    swarm = InProcessSwarm(simple_schedule(4, 3, 0.0, microbatches_per_holder=2), cfg,
                           OptimConfig(lr=1e-2, warmup_steps=1, total_steps=4), seed=3)
    swarm.run_iteration(random_batches(len(swarm.schedule.routes), cfg))
    save_checkpoint(tmp_path / "ck", swarm)
    r = _cli("export-hf", tmp_path / "ck", "-o", tmp_path / "hf")
    assert r.exit_code == 0, r.output
    ours, _ = load_model(tmp_path / "ck")
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(ours.eval()(tokens), theirs(tokens).logits, atol=1e-4, rtol=0)


def test_the_data_path_ends_documents_with_the_imported_eos(hf_dirs, tmp_path):
    from peers.data import Corpus, DataConfig
    from peers.tokenizer import end_of_text_id

    assert _cli("import-hf", hf_dirs[True][0], "-o", tmp_path / "a", "--stages", 2).exit_code == 0
    step, manifest = resolve_checkpoint(tmp_path / "a")
    docs = write_docs(tmp_path / "docs.txt")
    corpus = Corpus.build(DataConfig(paths=(str(docs),), tokenizer=str(step / "tokenizer.json"), seq_len=8,
                                     batch_size=2))
    assert manifest["imported_from"]["eos_token_id"] == 2  # </s>, named in the checkpoint's tokenizer_config.json
    assert end_of_text_id(corpus.tokenizer, step / "tokenizer.json") == 2
    assert any((batch == 2).any() for batch in corpus.validation_batches())
