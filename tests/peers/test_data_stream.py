"""Data at corpus scale: documents streamed from files with memory independent of their size, malformed input
skipped and counted, shards disjoint, positions resumable by seeking or by reading up to them."""

import json
import logging
import random
import threading
import time

import psutil
import pytest
import torch

import peers.document_stream as document_stream
from peers.data import Corpus, DataConfig
from peers.data_ledger import DataLedger
from peers.document_stream import DocPosition, DocumentStream
from peers.holder_shards import HolderShards
from peers.tokenizer import train_bpe

WORDS = "the swan heron duck goose crane stork gull tern owl hawk kite wren lark finch robin".split()


def paragraph(rng: random.Random, i: int, words: int = 12) -> str:
    return f"record {i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) + "."


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([paragraph(rng, i) for i in range(200)], 300).save(str(path))
    return str(path)


def test_text_documents_are_blank_line_paragraphs_wherever_the_read_blocks_end(tmp_path, monkeypatch):
    rng = random.Random(1)
    newline = ["\n", "\r\n", "\r"]
    parts = []
    for i in range(300):
        parts.append(paragraph(rng, i, rng.randint(0, 4)) + rng.choice(newline) + "  more " * rng.randint(0, 2))
        parts.append(rng.choice(newline) * rng.randint(2, 3) + " " * rng.randint(0, 1))
    raw = "".join(parts)
    (tmp_path / "a.txt").write_bytes(raw.encode())
    universal = raw.replace("\r\n", "\n").replace("\r", "\n")
    expected = [b.strip() for b in universal.split("\n\n") if b.strip()]
    monkeypatch.setattr(document_stream, "READ_BLOCK_BYTES", 7)
    stream = DocumentStream([str(tmp_path / "a.txt")])
    docs = list(stream.documents())
    assert [text for _, text in docs] == expected
    assert [pos.index for pos, _ in docs] == list(range(len(expected)))
    for pos, _ in docs[::37]:  # reading from any document's position gives the same documents from there
        assert [text for _, text in stream.documents(pos)] == expected[pos.index:]


def test_malformed_jsonl_lines_are_skipped_counted_and_named(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(document_stream, "MAX_DOCUMENT_BYTES", 100)
    lines = [json.dumps({"text": "a swan"}).encode(), b"not json", json.dumps({"text": 3}).encode(), b"[1, 2]",
             b'{"text": "\xff\xfe"}', b"", json.dumps({"text": "x" * 200}).encode(),
             json.dumps({"text": "a heron"}).encode() + b"\r"]
    (tmp_path / "b.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    docs = DocumentStream([str(tmp_path / "b.jsonl")]).documents()
    with caplog.at_level(logging.WARNING):
        assert [(pos.index, text) for pos, text in docs] == [(0, "a swan"), (1, "a heron")]
    assert docs.skipped == {"not valid JSON": 1, 'not an object with a "text" string': 2, "not UTF-8 text": 1,
                            "a document over 100 bytes": 1}
    assert "b.jsonl:2: not valid JSON" in caplog.text and "b.jsonl:5: not UTF-8" in caplog.text


def test_unsupported_and_missing_files_are_refused_naming_them(tmp_path):
    (tmp_path / "c.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="c.parquet: parquet is not supported.*jsonl"):
        DocumentStream([str(tmp_path / "c.parquet")])
    with pytest.raises(ValueError, match="missing.txt does not exist"):
        DocumentStream([str(tmp_path / "missing.txt")])
    with pytest.raises(ValueError, match="past the end"):
        (tmp_path / "d.txt").write_text("one\n\ntwo\n")
        DocumentStream([str(tmp_path / "d.txt")]).check_position(DocPosition(0, 0, 99))


class PeakRSS:
    """The largest resident set size of this process while inside the block (sampled every 5 ms)."""

    def __enter__(self):
        self.proc, self.peak, self._done = psutil.Process(), 0, threading.Event()
        self.start = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def test_a_corpus_larger_than_memory_allows_is_streamed_in_bounded_memory(tmp_path, tokenizer_file):
    """~330 MB of jsonl: a hostile 256 MB line (skipped without being held), then ~70 MB of records. Building the
    corpus and drawing 2,000 windows from each of two shards must not grow memory anywhere near the file's size
    (the whole-corpus tensor of before held every token of it)."""
    rng = random.Random(2)
    path = tmp_path / "big.jsonl"
    block = "".join(json.dumps({"text": paragraph(rng, i, 150)}) + "\n" for i in range(1000)).encode()
    with path.open("wb") as f:
        f.write(b'{"text": "')
        chunk = b"a" * (1 << 20)
        for _ in range(256):
            f.write(chunk)
        f.write(b'"}\n')
        for _ in range(70):
            f.write(block)
    size = path.stat().st_size
    assert size > 300e6
    with PeakRSS() as rss:
        corpus = Corpus.build(DataConfig(paths=(str(path),), tokenizer=tokenizer_file, seq_len=64, batch_size=8))
        shards = [corpus.shard(h, 2) for h in range(2)]
        for shard in shards:
            for _ in range(250):
                assert shard.next_batch().shape == (8, 65)
        assert len(corpus.validation_batches(4)) == 4
    growth = rss.peak - rss.start
    assert growth < 120e6 < size / 2, f"memory grew by {growth / 1e6:.0f} MB reading a {size / 1e6:.0f} MB file"
    for shard in shards:
        shard.close()


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory, tokenizer_file):
    """About 300 paragraphs per file in two files: several chunks of windows per shard at seq_len 8."""
    rng = random.Random(3)
    root = tmp_path_factory.mktemp("text")
    paths = []
    for name in ("a.txt", "b.txt"):
        (root / name).write_text("\n\n".join(paragraph(rng, i, 20) for i in range(1500)))
        paths.append(str(root / name))
    return Corpus.build(DataConfig(paths=tuple(paths), tokenizer=tokenizer_file, seq_len=8, batch_size=3))


def test_a_position_resumes_exactly_by_seeking_or_by_reading_up_to_it(text_corpus):
    shard = text_corpus.shard(1, 2)
    for _ in range(1500):  # well into the pass: several chunks in
        shard.next_batch()
    state = shard.state_dict()
    assert state["chunk"] > 0 and state["offset"] > 0
    ahead = [shard.next_batch() for _ in range(700)]
    sought = text_corpus.shard(1, 2)
    sought.load_state_dict(state)
    assert all(torch.equal(a, sought.next_batch()) for a in ahead)
    wire = {k: state[k] for k in ("holder", "num_holders", "epoch", "cursor")}  # what a commit carries
    read = text_corpus.shard(1, 2)
    read.load_state_dict(wire)
    assert read.state_dict() == state
    assert all(torch.equal(a, read.next_batch()) for a in ahead)
    with pytest.raises(ValueError, match="does not hold cursor"):
        text_corpus.shard(1, 2).load_state_dict({**state, "chunk": state["chunk"] + 1024})
    with pytest.raises(ValueError, match="past the end"):
        text_corpus.shard(1, 2).load_state_dict({**state, "offset": 10**12})


def test_a_rewound_iteration_draws_the_same_samples_again(text_corpus):
    data = HolderShards(text_corpus, DataLedger(holder="a"))
    data.assign([0, 1], 2, {})
    for it in range(400):  # past the first chunk of each shard
        data.draw(list(range(4)), iteration=it, epoch=0)
        data.commit(it)
    first = data.draw(list(range(4)), iteration=400, epoch=0)
    data.rewind(400)
    again = data.draw(list(range(4)), iteration=400, epoch=1)
    assert all(torch.equal(first[m], again[m]) for m in first)


def test_two_holders_shards_are_disjoint_and_cover_the_training_documents(text_corpus):
    tok, eos = text_corpus.tokenizer, text_corpus.eos
    found = []
    for h in range(2):
        shard = text_corpus.shard(h, 2)
        by_id = {}
        while shard.epoch == 0:
            rows = shard.next_batch()
            if shard.epoch == 0:
                by_id.update(zip(shard.last_indices, rows, strict=True))
        assert sorted(by_id) == list(range(len(by_id))), "each window of the pass drawn once"
        ids = torch.cat([by_id[i] for i in sorted(by_id)]).tolist()
        docs, current = [], []
        for t in ids:
            if t == eos:
                docs.append(tok.decode(current))
                current = []
            else:
                current.append(t)
        found.append(set(docs))
    everything = [text for _, text in text_corpus.documents.documents()]
    training = {text for i, text in enumerate(everything) if not text_corpus.held_out(i)}
    assert not found[0] & found[1]
    assert len(training - (found[0] | found[1])) <= 6  # at most the last few of each pass (cut mid-document)
    assert found[0] | found[1] <= training
