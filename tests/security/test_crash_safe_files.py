"""Hostile volunteers, crash-safe files (issue #17): a peer killed mid-save keeps its previous checkpoint, a
torn ledger line costs only that line, and a forged `latest` pointer leads nowhere outside the checkpoint root."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peers.checkpoint import PEER_MANIFEST, load_stage_checkpoint, resolve_checkpoint, save_stage_checkpoint
from peers.data_ledger import DataLedger, read_ledger
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker

REPO = Path(__file__).resolve().parents[2]
TINY = ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16)
SPLIT = (2, 1, 1)


def worker(fill: float | None = None) -> StageWorker:
    w = StageWorker("p", 1, TINY, SPLIT, OptimConfig(grad_clip=0))
    if fill is not None:
        with torch.no_grad():
            for p in w.module.parameters():
                p.fill_(fill)
    return w


def assert_restores(root: Path, iteration: int) -> None:
    w = worker()
    assert load_stage_checkpoint(root, w)["iteration"] == iteration
    assert all(torch.all(p == iteration) for p in w.module.parameters())


def test_a_crash_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    save_stage_checkpoint(root, worker(fill=1), iteration=1, seed=0)
    from safetensors.torch import save_file

    calls = []

    def torn_save(tensors, filename, metadata=None):  # the disk fills up half way through the second file
        calls.append(filename)
        if len(calls) == 2:
            Path(filename).write_bytes(b"\0" * 100)
            raise OSError(28, "No space left on device")
        save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr("peers.checkpoint.save_file", torn_save)
    with pytest.raises(OSError, match="No space"):
        save_stage_checkpoint(root, worker(fill=2), iteration=2, seed=0)
    assert len(calls) == 2
    assert_restores(root, 1)


KILLED_SAVE = """
import os, sys, torch
import peers.checkpoint as ck
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.worker import StageWorker
w = StageWorker("p", 1, ModelConfig(vocab_size=64, dim=16, n_layers=4, n_heads=2, ffn_dim=32, max_seq_len=16),
                (2, 1, 1), OptimConfig(grad_clip=0))
with torch.no_grad():
    for p in w.module.parameters():
        p.fill_(2)
real, calls = ck.save_file, []
def killed(tensors, filename, metadata=None):
    calls.append(filename)
    if len(calls) == 2:
        os._exit(9)  # SIGKILL-like: no except, no finally, no flush
    real(tensors, filename, metadata=metadata)
ck.save_file = killed
ck.save_stage_checkpoint(sys.argv[1], w, iteration=2, seed=0)
"""


def test_a_peer_killed_mid_save_keeps_its_previous_checkpoint(tmp_path):
    root = tmp_path / "ck"
    save_stage_checkpoint(root, worker(fill=1), iteration=1, seed=0)
    done = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(root)], cwd=REPO, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert_restores(root, 1)
    save_stage_checkpoint(root, worker(fill=3), iteration=3, seed=0)  # the next save clears the half-written one
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000001", "step-00000003"]
    assert_restores(root, 3)


def test_a_torn_last_ledger_line_is_read_past(tmp_path, caplog):
    path = tmp_path / "ledger.jsonl"
    ledger = DataLedger(path, holder="a")
    ledger.draw(iteration=0, epoch=0, shard=0, data_epoch=0, microbatch=0, windows=[3, 4])
    ledger.commit(0)
    with path.open("ab") as f:  # the holder died half way through its next line
        f.write(b'{"holder": "a", "event": "dr')
    assert [e["event"] for e in read_ledger(path)] == ["draw", "processed"]
    assert "torn last line 3" in caplog.text

    again = DataLedger(path, holder="a")  # restarted on the same file: appends start on a clean line
    again.commit(1)
    assert [e["event"] for e in read_ledger(path)] == ["draw", "processed", "processed"]

    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"holder": "a", "ev', *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"ledger .* line 2 is not a JSON object"):
        read_ledger(path)  # a bad line in the middle is no crash: refused, not skipped
    path.write_text(lines[0] + "\n[1, 2]\n")
    with pytest.raises(ValueError, match="line 2 is not a JSON object"):
        read_ledger(path)


@pytest.mark.parametrize("pointer", ["../evil", "EVIL_ABSOLUTE", "step-00000002/../../evil", "step-2\x00",
                                     "x" * 10_000, "LINK_STEP", "LINK_DEVZERO"])
def test_a_forged_latest_pointer_is_refused(tmp_path, caplog, pointer):
    root, evil = tmp_path / "ck", tmp_path / "evil"
    save_stage_checkpoint(evil, worker(fill=99), iteration=99, seed=0)
    evil_step = resolve_checkpoint(evil, PEER_MANIFEST)[0]
    for it in (1, 2):
        save_stage_checkpoint(root, worker(fill=it), iteration=it, seed=0)
    (root / "latest").unlink()
    if pointer == "LINK_STEP":  # a plain step name, but the directory is a link out of the root
        os.symlink(evil_step, root / "step-00000099")
        (root / "latest").write_text("step-00000099\n")
    elif pointer == "LINK_DEVZERO":
        os.symlink("/dev/zero", root / "latest")
    else:
        (root / "latest").write_text(pointer.replace("EVIL_ABSOLUTE", str(evil_step)))

    assert_restores(root, 2)  # the newest complete step directory inside the root, never the forged one
    assert resolve_checkpoint(root, PEER_MANIFEST)[0] == root / "step-00000002"
    assert "ignored" in caplog.text or "refused" in caplog.text
    assert json.loads((evil_step / PEER_MANIFEST).read_text())["iteration"] == 99, "the forged target is untouched"
