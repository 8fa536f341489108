"""Which holder draws which of the run's shards: a shard follows the holders that inject (a full pipeline's column
may start at another holder after a re-plan), and a holder that takes a shard over starts it where the newest
commit left it, so no sample is skipped or drawn twice."""

from __future__ import annotations

from swarm.coordinator.shard_assignment import assign_shards, shards_to_injectors


def test_a_holder_keeps_its_shards_and_a_departed_holders_go_to_the_drawer_with_the_fewest():
    shards = assign_shards({"a": [0], "b": [1, 3], "gone": [2]}, ["a", "b"], ["a", "b"], 4)
    assert shards == {"a": [0, 2], "b": [1, 3]}
    # a new drawer takes one over from a drawer carrying several; one with its own documents takes none
    shards = assign_shards({"a": [0, 2], "b": [1]}, ["a", "b", "new", "own"], ["a", "b", "new"], 3)
    assert shards == {"a": [0], "b": [1], "new": [2], "own": []}


def test_the_shards_of_a_holder_that_injects_nothing_go_to_one_that_does():
    shards, moves = shards_to_injectors({"a": [0], "b": [1], "c": [2]}, injecting={"b"}, drawers=["a", "b", "c"])
    assert shards == {"a": [], "b": [1, 0, 2], "c": []}
    assert moves == [(0, "a", "b"), (2, "c", "b")]
    # two injectors: each takes from the idle ones in turn, and one left without a shard takes one
    shards, _ = shards_to_injectors({"a": [0, 1, 2], "b": [], "c": []}, injecting={"b", "c"},
                                    drawers=["a", "b", "c"])
    assert sorted(shards["b"] + shards["c"]) == [0, 1, 2] and shards["b"] and shards["c"] and not shards["a"]
    # a holder with its own documents neither gives nor takes the run's shards; nobody to give them to: unchanged
    assert shards_to_injectors({"a": [0], "own": []}, injecting={"own"}, drawers=["a"]) == ({"a": [0], "own": []}, [])
