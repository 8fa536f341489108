"""A benchmark corpus that the tiny model cannot memorise in a benchmark window: the Python standard library's
own sources, one module per document, as jsonl.

The bundled corpus (`pydoc_data.topics`, ~465 KB) is learnt by heart within minutes by a local swarm of the tiny
model, after which validation loss climbs again and "time to a target loss" measures which method memorises
first. The standard library's modules (~11 MB without the test suites) are on every machine that runs us, so
nothing is downloaded, and a local swarm reads less than one pass of them in a 13-minute window.

Documents are whole modules, which makes the held-out split a set of unseen modules rather than paragraphs of seen
ones. They are written in a seeded shuffle of their sorted paths (`ORDER_SEED`): the same file on every run of one
Python version, and a stream that does not drift from one package to the next: data holders read their documents in
file order, so in path order every shard would read `asyncio` first and reach the `encodings` package's generated
codec tables together, ~1M tokens in.
"""

from __future__ import annotations

import hashlib
import json
import random
import sysconfig
from pathlib import Path

SKIPPED_DIRS = frozenset({"site-packages", "test", "tests", "idle_test", "__pycache__"})
"""Third-party code and test suites (the latter are largely generated data and repeated boilerplate)."""
ORDER_SEED = 0
"""Seed of the order the modules are written in."""


def module_sources(stdlib: Path, order_seed: int | None = ORDER_SEED) -> list[Path]:
    """The .py files under `stdlib`, outside `SKIPPED_DIRS`, in a shuffle of their paths relative to it, seeded
    with `order_seed` (None: in path order, as `benchmarks/corpus_order.py` compares)."""
    paths = sorted((p for p in stdlib.rglob("*.py")
                    if not SKIPPED_DIRS & set(p.relative_to(stdlib).parts[:-1]) and p.is_file()),
                   key=lambda p: p.relative_to(stdlib).as_posix())
    if order_seed is not None:
        random.Random(order_seed).shuffle(paths)
    return paths


def write_stdlib_corpus(out: Path, stdlib: Path | None = None, order_seed: int | None = ORDER_SEED) -> dict:
    """Write the corpus to `out` (one {"text": module source} per line; modules that are not UTF-8 or are empty
    are left out), its modules in `module_sources`'s order, and describe it: documents, bytes, and a digest of the
    content (to tell corpora apart)."""
    stdlib = stdlib or Path(sysconfig.get_paths()["stdlib"])
    digest, documents, size = hashlib.sha256(), 0, 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for path in module_sources(stdlib, order_seed):
            try:
                text = path.read_text(encoding="utf-8").strip()
            except (UnicodeDecodeError, OSError):
                continue
            if not text:
                continue
            line = json.dumps({"text": text}) + "\n"
            f.write(line)
            digest.update(line.encode())
            documents, size = documents + 1, size + len(text.encode())
    return {"path": str(out), "source": str(stdlib), "documents": documents, "bytes": size,
            "sha256": digest.hexdigest()[:16]}
