"""Which of two estranged stage members sits out, for how long, and when it may come back."""

from __future__ import annotations

from swarm.coordinator.estrangements import MAX_SIT_OUT, SIT_OUT, Estrangements


def test_the_later_joiner_sits_out_and_each_new_estrangement_of_the_pair_doubles_its_cool_down():
    joined = {"veteran": 0.0, "newcomer": 50.0}
    e = Estrangements(joined.__getitem__)
    first = e.estrange("newcomer", "veteran", 2, now=100.0)
    assert (first.benched, first.partner, first.stage, first.times) == ("newcomer", "veteran", 2, 1)
    assert first.until == 100.0 + SIT_OUT
    assert e.estrange("veteran", "newcomer", 2, now=101.0) is None  # already split: reported twice, one decision
    assert e.sitting_out(100.0 + SIT_OUT - 1) == {"newcomer"}
    assert e.sitting_out(100.0 + SIT_OUT) == set()  # placed again; estranged again, it sits out twice as long
    second = e.estrange("veteran", "newcomer", 2, now=200.0)
    assert second.benched == "newcomer" and second.until == 200.0 + 2 * SIT_OUT
    for _ in range(10):
        last = e.estrange("veteran", "newcomer", 2, now=1e4)
        e.forget("veteran")
    assert last.until == 1e4 + MAX_SIT_OUT


def test_a_partner_that_leaves_lets_the_peer_sitting_out_come_back_at_once():
    e = Estrangements(lambda peer: 0.0)
    assert e.estrange("a", "b", 1, now=0.0).benched == "b"  # joined together: the larger id sits out
    assert e.estrange("b", "c", 1, now=0.0) is None  # b sits out already: nothing more to split
    e.forget("a")
    assert e.sitting_out(1.0) == set()
