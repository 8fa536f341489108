"""Lineages of a stage group's copies: chained over the rounds they stepped with, judged by majority."""

from __future__ import annotations

from swarm.stage_group.lineage import LINEAGE_BYTES, Verdict, chain, judge, next_lineage


def test_a_lineage_depends_on_the_base_the_iteration_and_every_contributor_of_some_weight():
    base = next_lineage(b"", 3, {"a": 1, "b": 2})
    assert len(base) == LINEAGE_BYTES
    assert base == next_lineage(b"", 3, {"b": 2, "a": 1})  # the order heard in does not matter
    others = [next_lineage(b"x", 3, {"a": 1, "b": 2}), next_lineage(b"", 4, {"a": 1, "b": 2}),
              next_lineage(b"", 3, {"a": 1}), next_lineage(b"", 3, {"a": 1, "b": 3}),
              next_lineage(b"", 3, {"a": 1, "c": 2})]
    assert len({base, *others}) == 6
    assert next_lineage(b"", 3, {"a": 1, "b": 2, "c": 0}) == base  # a contribution of no weight moves nothing


def test_the_lineage_most_members_hold_is_the_groups_and_the_others_stray():
    assert judge({"a": b"L", "b": b"M", "c": b"L"}) == Verdict(b"L", ("a", "c"), ("b",))


def test_a_tie_goes_to_the_lineage_held_by_the_smallest_peer_id_whatever_the_lineages_are():
    assert judge({"b": b"\x00", "a": b"\xff"}) == Verdict(b"\xff", ("a",), ("b",))
    assert judge({"a": b"\x00", "b": b"\xff", "c": b"\x01", "d": b"\xff"}) == Verdict(b"\xff", ("b", "d"), ("a", "c"))


def test_a_copy_with_no_lineage_has_no_vote_and_strays_from_nothing():
    assert judge({"a": b"", "b": b"L", "c": b"L"}) == Verdict(b"L", ("b", "c"), ())
    assert judge({"a": b"", "b": b""}) == Verdict(b"", (), ())


def test_a_stray_goes_on_from_the_groups_lineage_only_once_mended():
    verdict, round_ = Verdict(b"L", ("a", "c"), ("b",)), {"a": 1, "b": 1, "c": 1}
    group = next_lineage(b"L", 5, round_)
    assert chain(b"L", verdict, None, 5, round_) == group  # a holder
    assert chain(b"", verdict, None, 5, round_) == group  # a new copy takes the group's
    assert chain(b"M", verdict, True, 5, round_) == group  # a stray that took the holders' state
    assert chain(b"M", verdict, False, 5, round_) == next_lineage(b"M", 5, round_) != group  # found again next round
    assert chain(b"", judge({}), None, 5, round_) == next_lineage(b"", 5, round_)
