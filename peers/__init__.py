"""What one peer computes (torch, no networking).

The code is organized as follows:
- model.py: `ModelConfig`, `FLAVORS` and `Transformer`, the LLaMA-style decoder in one readable file
- stage.py: which layers each stage owns (`balanced_split`), `build_stage`, the model minus what a stage lacks, and
  `neighbour_blocks`, a stage that lost every peer restarted from a neighbouring stage's blocks
- optim.py: `OptimConfig`, AdamW with decay on matrices only, the warmup + cosine `lr_at`
- worker.py: `StageWorker`, forward/backward of one stage for microbatches in any order, gradient accounting, step
- paced_worker.py: `PacedWorker`, a worker that takes as long as a device of a stated speed (compute emulation)
- device_speed.py: what a peer measures of its device at join time (seconds per layer, the loss step)
- averaging.py: same-stage gradient averaging weighted by the microbatches each peer processed, robust to a liar
- robust_mean.py: CenteredClip and the check against the stage's gradient history (pure functions)
- tokenizer.py: a local tokenizer.json, or a byte-level BPE trained once on the corpus and cached
- data.py: `DataConfig`, `Corpus` (local text/jsonl or the bundled pydoc corpus, validation split), `Shard`
- document_stream.py: `DocumentStream`, the documents of text/jsonl files read as a stream from any position
- token_windows.py: training windows in resumable shuffled chunks, tokenized ahead by a `Prefetcher` thread
- durable.py: fsync_dir, a directory's entries made durable (checkpoints, the data ledger)
- data_ledger.py: `DataLedger`, a data holder's record of every sample drawn, processed, retried or requeued
- holder_shards.py: `HolderShards`, the shards a data holder draws from, rewound when an iteration is redone
- inprocess.py: `InProcessSwarm`, a whole `Schedule` executed in one process; `simple_schedule` for studies
- train.py: the in-process training loop (validation, checkpoints, metrics), shared by the CLI and benchmarks
- checkpoint.py: safetensors + JSON checkpoints with hashes, exact resume, clear refusals
- evaluate.py: validation perplexity of the whole model and with a fraction of the stages omitted
"""

from peers.data import Corpus, DataConfig, Shard
from peers.evaluate import EvalResult, evaluate
from peers.inprocess import InProcessSwarm, IterationStats, simple_schedule
from peers.model import FLAVORS, ModelConfig, Transformer
from peers.optim import OptimConfig, lr_at
from peers.stage import balanced_split, build_stage
from peers.worker import MemoryLimitError, StageWorker, StepStats, WorkerError

__all__ = [
    "FLAVORS",
    "Corpus",
    "DataConfig",
    "EvalResult",
    "InProcessSwarm",
    "IterationStats",
    "MemoryLimitError",
    "ModelConfig",
    "OptimConfig",
    "Shard",
    "StageWorker",
    "StepStats",
    "Transformer",
    "WorkerError",
    "balanced_split",
    "build_stage",
    "evaluate",
    "lr_at",
    "simple_schedule",
]
