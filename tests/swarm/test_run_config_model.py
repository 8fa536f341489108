"""A run's model as a [model] table (import-hf's run.toml) or a checkpoint to start from (run.init_from): accepted,
carried exactly in the run spec, malformed or mismatched ones refused by name, and a volunteer's --init-from copy
checked against the run's digests."""

import tomllib

import pytest
from click.testing import CliRunner

from peers.model import FLAVORS, ModelConfig
from swarm.peer.stage_session import InitialWeightsRefused, check_initial_weights
from swarm.run_config import RunConfig
from tests.utils.hf_llama import write_hf_llama

pytest.importorskip("transformers")


def _import(hf, out, seed=None):
    from swarm.cli.main import main

    write_hf_llama(hf, tied=True, seed=seed)
    r = CliRunner().invoke(main, ["import-hf", str(hf), "-o", str(out), "--stages", "2"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return _import(tmp_path_factory.mktemp("hf"), tmp_path_factory.mktemp("import") / "ckpt")


def test_import_hf_run_toml_drives_a_run_spec(ckpt):
    cfg = RunConfig.from_toml(ckpt / "run.toml")  # as written: 2 stages, so skip 0 (every path visits both)
    assert cfg.skip == 0.0
    model = ModelConfig.from_dict(tomllib.loads((ckpt / "run.toml").read_text())["model"])
    assert cfg.model == "custom" and cfg.architecture == model and cfg.stages == 2
    assert cfg.data.tokenizer.endswith("tokenizer.json") and not cfg.init_weights
    back, spec_model = RunConfig.from_spec(cfg.to_spec(coordinator="c", vocab_size=280))  # tokens < padded vocab
    assert spec_model == model and back.architecture == model and back.model_config(280) == model
    with pytest.raises(ValueError, match="the tokenizer has 300 tokens, more than model.vocab_size 288"):
        cfg.to_spec(coordinator="c", vocab_size=300)


def test_init_from_brings_model_stages_tokenizer_and_digests(ckpt):
    cfg = RunConfig.from_tables({"run": {"init_from": str(ckpt), "skip": 0.0}})
    assert cfg.model == "custom" and cfg.architecture.tie_embeddings and cfg.stages == 2
    assert cfg.data.tokenizer.endswith("tokenizer.json") and len(cfg.init_weights) == 2
    back, _ = RunConfig.from_spec(cfg.to_spec(coordinator="c", vocab_size=280))
    assert back.init_weights == cfg.init_weights and back.init_from == ""  # the path is the coordinator's own
    with pytest.raises(ValueError, match="run.model 'tiny' is not the model the .model. table .or the checkpoint"):
        RunConfig.from_tables({"run": {"init_from": str(ckpt), "model": "tiny", "skip": 0.0}})
    with pytest.raises(ValueError, match=f"run.init_from {ckpt}: checkpoint was made with model.dim=64, this run has "
                                         "128"):
        RunConfig.from_tables({"run": {"init_from": str(ckpt), "skip": 0.0}, "model": FLAVORS["tiny"].to_dict()})
    with pytest.raises(ValueError, match=r"split=\[2, 2\], this run has \[1, 1, 1, 1\]"):
        RunConfig.from_tables({"run": {"init_from": str(ckpt), "stages": 4}})


@pytest.mark.parametrize("tables, message", [
    ({"model": {"dim": "wide"}}, "model.dim must be a positive integer"),
    ({"model": {"hidden": 3}}, "unknown model config field.*hidden"),
    ({"model": {"n_kv_heads": 3}}, "model.n_kv_heads must be a positive divisor"),
    ({"model": {"dim": 1 << 20, "n_heads": 4}}, "model.dim=1048576 is larger than this build accepts"),
    ({"model": "tiny"}, "model config must be a table"),
    ({"model": {}, "run": {"model": "tiny"}}, "run.model and a .model. table both name the model"),
    ({"model": {"n_layers": 2}, "run": {"stages": 3}}, "run.stages: custom has 2 layers"),
    ({"run": {"model": "custom"}}, "run.model must be one of"),
])
def test_malformed_model_tables_are_refused_by_name(tables, message):
    with pytest.raises(ValueError, match=message):
        RunConfig.from_tables(tables)


def test_a_hostile_spec_model_is_refused():
    spec = RunConfig().to_spec(coordinator="c", vocab_size=512)
    for model, message in (({**spec.model, "n_layers": 10**6}, "model.n_layers=1000000 is larger"),
                           ({**spec.model, "dim": 256}, "run.model 'tiny' is not the model")):
        hostile = type(spec)(**{**spec.__dict__, "model": model})
        with pytest.raises(ValueError, match=message):
            RunConfig.from_spec(hostile)
    flavor, model = RunConfig.from_spec(spec)
    assert flavor.model == "tiny" and model.dim == FLAVORS["tiny"].dim and model.vocab_size == 512


def test_a_volunteers_init_from_copy_must_hold_the_runs_weights(ckpt, tmp_path):
    cfg = RunConfig.from_tables({"run": {"init_from": str(ckpt), "skip": 0.0}})
    check_initial_weights(str(ckpt), cfg, cfg.architecture)  # the same files: accepted
    check_initial_weights(None, cfg, cfg.architecture)  # none: it may join later and take a peer's state
    other = _import(tmp_path / "hf", tmp_path / "other", seed=9)
    with pytest.raises(InitialWeightsRefused, match="stage-0.safetensors is not this run's initial weights"):
        check_initial_weights(str(other), cfg, cfg.architecture)
    with pytest.raises(InitialWeightsRefused, match="this run starts from its seed"):
        check_initial_weights(str(ckpt), RunConfig(), FLAVORS["tiny"])


def test_the_commands_refuse_a_model_that_cannot_hold_the_tokenizer(ckpt, tmp_path):
    from swarm.cli.main import main

    small = {**ModelConfig.from_dict(tomllib.loads((ckpt / "run.toml").read_text())["model"]).to_dict(),
             "vocab_size": 100}
    lines = ["[run]", "stages = 2", "skip = 0.0", "[model]"] + [f"{k} = {str(v).lower() if isinstance(v, bool) else v}"
                                                               for k, v in small.items()]
    lines += ["[data]", f'tokenizer = "{ckpt}/step-00000000/tokenizer.json"']
    (tmp_path / "run.toml").write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(main, ["coordinator", "start", "--config", str(tmp_path / "run.toml"),
                                  "--identity", str(tmp_path / "id.key")])
    assert r.exit_code == 2 and "the tokenizer has 280 tokens, more than model.vocab_size 100" in r.output, r.output
    r = CliRunner().invoke(main, ["swarm", "local", "--init-from", str(ckpt), "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 2 and "run.skip 0.33 with 2 stages" in r.output and not (tmp_path / "run").exists()
