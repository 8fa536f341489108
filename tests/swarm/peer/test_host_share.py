"""A peer's torch threads: its share of the machine's cores among the live peers registered on it."""

import os

import pytest

from swarm.peer.host_share import HostRegistry, ThreadShare, available_cpus, live_peers, threads_for


@pytest.mark.parametrize("cpus, peers, threads", [(2, 6, 1), (16, 1, 16), (16, 3, 5), (8, 0, 8), (1, 1, 1)])
def test_threads_are_an_equal_share_of_at_least_one(cpus, peers, threads):
    assert threads_for(cpus, peers) == threads


def test_the_registry_counts_live_peers_and_forgets_the_dead(tmp_path):
    assert live_peers(tmp_path / "none") == 0
    a, b = HostRegistry(tmp_path), HostRegistry(tmp_path)
    a.join()
    b.join()
    assert live_peers(tmp_path) == 2
    (tmp_path / "123-dead.lock").write_text("123\n")  # a process killed without cleaning up
    assert live_peers(tmp_path) == 2 and not (tmp_path / "123-dead.lock").exists()
    b.leave()
    assert live_peers(tmp_path) == 1 and len(os.listdir(tmp_path)) == 1


def test_joining_sweeps_the_entries_of_dead_processes(tmp_path):
    for pid in range(100, 130):  # peers killed without cleaning up, never counted (they ran with --threads)
        (tmp_path / f"{pid}-dead.lock").write_text(f"{pid}\n")
    HostRegistry(tmp_path).join()
    assert len(os.listdir(tmp_path)) == 1


def test_an_automatic_share_shrinks_as_peers_join(tmp_path):
    share = ThreadShare(None, tmp_path)
    peers = [HostRegistry(tmp_path) for _ in range(available_cpus() + 1)]
    for p in peers:
        p.join()
    assert share.size() == 1
    for p in peers[1:]:
        p.leave()
    assert share.size() == available_cpus()
    assert ThreadShare(3, tmp_path).size() == 3  # --threads wins


def test_apply_sets_torch_threads():
    import torch

    before = torch.get_num_threads()
    try:
        assert ThreadShare(1).apply() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
