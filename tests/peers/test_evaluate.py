import math

import pytest
from peers_util import MICRO, random_batches

from peers.evaluate import evaluate, mean_loss, omitted_layer_orders
from peers.model import Transformer, lm_loss


def test_omitted_stages_are_a_sorted_subset_after_stage0():
    orders, keep = omitted_layer_orders((1, 1, 1, 1, 1), 0.5, 20, seed=3)
    assert keep == 2
    for order in orders:
        assert order[0] == 0 and len(order) == 3 and order == sorted(order)
    assert len({tuple(o) for o in orders}) > 1, "subsets are drawn per batch"
    assert omitted_layer_orders((1, 1, 1, 1, 1), 0.5, 20, seed=3)[0] == orders


def test_perplexity_whole_and_omitted():
    model = Transformer(MICRO, seed=2)
    batches = list(random_batches(3, seq=8).values())
    res = evaluate(model, batches, (1, 1, 1, 1), omit=2 / 3, seed=0)
    by_hand = sum(lm_loss(model(b[:, :-1]), b[:, 1:]).item() for b in batches) / 3
    assert res.loss == pytest.approx(by_hand, rel=1e-6)
    assert res.perplexity == pytest.approx(math.exp(by_hand), rel=1e-6)
    assert res.kept_stages == 1 and res.loss_omitted != pytest.approx(res.loss)
    assert mean_loss(model, batches, [[0, 1, 2, 3]] * 3) == pytest.approx(res.loss, rel=1e-6)
    assert evaluate(model, batches, (1, 1, 1, 1)).perplexity_omitted is None
    with pytest.raises(ValueError, match="whole model"):
        evaluate(Transformer(MICRO, layers=[0]), batches, (1, 1, 1, 1))
    assert model.training, "evaluation restores the training mode"
