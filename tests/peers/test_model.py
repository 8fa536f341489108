import pytest
import torch
from peers_util import MICRO

from peers.model import FLAVORS, ModelConfig, Transformer, lm_loss
from peers.stage import balanced_split, build_stage, stage_layers


def test_stage_state_dicts_are_slices_of_the_full_model():
    full = Transformer(MICRO, seed=3)
    split = balanced_split(MICRO.n_layers, 3)
    assert split == (2, 1, 1)
    merged = {}
    for s in range(3):
        part = build_stage(MICRO, split, s, seed=3).state_dict()
        assert not set(part) & set(merged), "stages must not share parameters"
        merged.update(part)
    ref = full.state_dict()
    assert set(merged) == set(ref)
    for k, v in ref.items():
        assert torch.equal(merged[k], v), k
    assert "tok_embeddings.weight" in build_stage(MICRO, split, 0).state_dict()
    assert "output.weight" not in build_stage(MICRO, split, 1).state_dict()
    assert stage_layers(split, 2) == [3]


def test_forward_pieces_equal_the_whole_and_attention_is_causal():
    model = Transformer(MICRO)
    tokens = torch.randint(0, MICRO.vocab_size, (2, 10))
    logits = model(tokens)
    assert logits.shape == (2, 10, MICRO.vocab_size)
    assert torch.allclose(model.logits(model.run_layers(model.embed(tokens))), logits)
    changed = tokens.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % MICRO.vocab_size
    assert torch.allclose(model(changed)[:, :6], logits[:, :6], atol=1e-6)
    assert not torch.allclose(model(changed)[:, 6:], logits[:, 6:])


def test_block_is_position_free_and_runs_anywhere_on_a_path():
    """A block computes its rotary table from T: the same input gives the same output at any hop."""
    model = Transformer(MICRO)
    h = torch.randn(2, 7, MICRO.dim)
    assert torch.equal(model.layers["2"](h), model.layers["2"](h.clone()))
    swapped = model.run_layers(h, [0, 2, 1, 3])
    assert not torch.allclose(swapped, model.run_layers(h))
    assert model.layers["1"].attention.wq.weight.shape == (MICRO.dim, MICRO.dim)
    assert len([b for b in model.state_dict() if "rotary" in b or "freqs" in b]) == 0


def test_flavors_are_valid_and_param_counts_match():
    for cfg in FLAVORS.values():
        cfg.validate()
    tiny = FLAVORS["tiny"]
    assert tiny.num_params() == sum(p.numel() for p in Transformer(tiny).parameters())
    assert tiny.num_params() < 5_000_000
    assert 4e8 < FLAVORS["500m"].num_params() < 6e8
    assert 1.2e9 < FLAVORS["1.5b"].num_params() < 1.8e9


@pytest.mark.parametrize("bad", [{"dim": 30, "n_heads": 4}, {"n_layers": 0}, {"vocab_size": -1}])
def test_bad_model_config_names_the_field(bad):
    with pytest.raises(ValueError, match="model."):
        ModelConfig(**bad).validate()
    with pytest.raises(ValueError, match="unknown"):
        ModelConfig.from_dict({"dims": 3})


def test_loss_is_mean_cross_entropy():
    logits = torch.zeros(1, 3, 5)
    assert abs(float(lm_loss(logits, torch.tensor([[0, 1, 2]]))) - torch.log(torch.tensor(5.0)).item()) < 1e-6
