"""Validation loss of a networked run over wall-clock time, from the checkpoints its peers write.

A peer keeps only its last two checkpoints (`run.checkpoint_every`, `--checkpoint-dir`), so `CheckpointSnapshots`
copies each new step directory out of every peer's checkpoint root while the run goes on. Afterwards
`validation_curve` gathers the stages of each saved iteration into a whole model (`skippipe gather`'s code) and
measures its loss on the run's fixed validation batches (`skippipe eval`'s), stamped with the time that iteration
was committed (the coordinator's metrics). `time_to_loss` reads a curve: the first time it reaches a target.

Used by `benchmarks/churn.py` (convergence under churn). Nothing here needs the run's processes: a frozen or
killed peer's last copied checkpoints still count, as a user's `skippipe gather` of the surviving copies would.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from pathlib import Path

from peers.checkpoint import PEER_MANIFEST, CheckpointError, load_model
from peers.checkpoint_gather import gather_checkpoint
from peers.data import Corpus, DataConfig
from peers.evaluate import mean_loss

logger = logging.getLogger(__name__)



class CheckpointSnapshots:
    """Copies every new peer checkpoint step directory under `run_dir`'s `ckpt-*` roots into
    `out/iteration-{N}/{root}/step-...` (with a `latest` pointer), polling every `period` seconds until `stop`.

    A step directory appears by an atomic rename once its files are durable, so one that is visible is complete;
    one pruned while being copied is dropped and counted in `missed`.
    """

    def __init__(self, run_dir: Path, out: Path, period: float = 0.5) -> None:
        self.run_dir, self.out, self.period = Path(run_dir), Path(out), period
        self.copied: set[tuple[str, str]] = set()
        self.missed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-snapshots", daemon=True)

    def start(self) -> CheckpointSnapshots:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.poll()  # what was written since the last look

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            self.poll()

    def poll(self) -> None:
        for root in sorted(self.run_dir.glob("ckpt-*")):
            for step in sorted(root.glob("step-*")):
                key = (root.name, step.name)
                if key in self.copied or not (step / PEER_MANIFEST).is_file():
                    continue
                iteration = int(step.name.split("-")[1])
                dest = self.out / f"iteration-{iteration:08d}" / root.name
                try:
                    shutil.copytree(step, dest / step.name, dirs_exist_ok=True)
                    (dest / "latest").write_text(f"{step.name}\n")
                except OSError as e:  # pruned by the peer meanwhile
                    logger.warning("could not copy %s: %s", step, e)
                    shutil.rmtree(dest, ignore_errors=True)
                    self.missed += 1
                self.copied.add(key)


def validation_curve(snapshots: Path, records: list[dict], start: float, batches: int) -> list[dict]:
    """[{"iteration", "seconds", "loss"}] for every snapshot iteration whose stages all survive, in order:
    `seconds` from `start` (wall clock) to that iteration's commit in the coordinator's `records`, `loss` the
    token-weighted validation loss of the gathered whole model on the first `batches` validation batches."""
    committed = {r["iteration"]: r["time"] for r in records}
    curve, corpus = [], None
    for it_dir in sorted(Path(snapshots).glob("iteration-*")):
        iteration = int(it_dir.name.split("-")[1])
        if iteration not in committed:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                gather_checkpoint([it_dir], Path(tmp) / "whole")
                model, manifest = load_model(Path(tmp) / "whole")
            except (CheckpointError, ValueError, OSError) as e:  # a stage whose every holder's copy is missing
                logger.warning("iteration %d not evaluated: %s", iteration, e)
                continue
        if corpus is None:  # the run's own data config: the same tokenizer and validation split as its peers
            corpus = Corpus.build(DataConfig.from_dict(manifest["data"]))
        loss = mean_loss(model, corpus.validation_batches(batches))
        curve.append({"iteration": iteration, "seconds": round(committed[iteration] - start, 3),
                      "loss": round(loss, 5)})
    return curve


def time_to_loss(curve: list[dict], target: float) -> float | None:
    """Seconds until the curve first reaches `target` (None: not within it)."""
    return next((p["seconds"] for p in curve if p["loss"] <= target), None)
