import json

import pytest
import torch

from peers.data import Corpus, DataConfig
from peers.document_stream import DocumentStream
from peers.tokenizer import cache_dir, load_tokenizer


@pytest.fixture(scope="module")
def corpus():
    return Corpus.build(DataConfig(seq_len=32, batch_size=4))


def test_bundled_corpus_tokenizer_is_trained_once_and_cached(corpus):
    assert corpus.vocab_size == 4096
    cached = list(cache_dir().glob("bpe-4096-*.json"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    again = Corpus.build(DataConfig(seq_len=32, batch_size=4))
    assert cached[0].stat().st_mtime_ns == mtime, "the second build must reuse the cached tokenizer"
    assert torch.equal(again.shard(0, 2).next_batch(), corpus.shard(0, 2).next_batch())
    assert all(torch.equal(a, b) for a, b in zip(again.validation_batches(), corpus.validation_batches(), strict=True))
    text = "The with statement wraps a block."
    assert corpus.tokenizer.decode(corpus.tokenizer.encode(text).ids) == text


def test_shards_are_deterministic_and_resumable(corpus):
    shards = [corpus.shard(i, 3) for i in range(3)]
    first = [shards[0].next_batch() for _ in range(3)]
    assert first[0].shape == (4, 33)
    assert not torch.equal(shards[1].next_batch(), first[0])
    state = shards[0].state_dict()
    ahead = [shards[0].next_batch() for _ in range(300)]  # crosses an epoch
    assert shards[0].epoch >= 1
    resumed = corpus.shard(0, 3)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, resumed.next_batch()) for a in ahead)
    fresh = corpus.shard(0, 3)
    assert torch.equal(fresh.next_batch(), first[0])
    with pytest.raises(ValueError, match="shard 0 of 3"):
        corpus.shard(1, 3).load_state_dict(state)
    with pytest.raises(ValueError, match="out of range"):
        corpus.shard(0, 3).load_state_dict({**state, "cursor": 10**9})


def test_validation_split_is_held_out(corpus):
    val = corpus.validation_batches()
    assert len(val) >= 2 and val[0].shape == (4, 33)
    assert torch.equal(val[0], corpus.validation_batches(1)[0])
    whole = corpus.shard(0, 1)
    train = []
    while whole.epoch == 0:
        train.append(whole.next_batch())
    train_bytes = torch.cat(train).flatten().numpy().astype("int32").tobytes()
    for batch in val[:2]:
        for row in batch:
            assert row.numpy().astype("int32").tobytes() not in train_bytes, "validation text leaked into training"
    assert len(train) > 10 * len(val)


def test_local_text_and_jsonl_files(tmp_path):
    (tmp_path / "a.txt").write_text("first paragraph about ducks.\n\nsecond paragraph about geese.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "a swan"}) + "\n\n" + json.dumps({"text": "a heron"}) + "\n")
    docs = [text for _, text in DocumentStream([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")]).documents()]
    assert docs == ["first paragraph about ducks.", "second paragraph about geese.", "a swan", "a heron"]
    tok = load_tokenizer(None, docs * 20, vocab_size=300)
    path = tmp_path / "tok.json"
    tok.save(str(path))
    assert load_tokenizer(path).encode("a swan").ids == tok.encode("a swan").ids


@pytest.mark.parametrize("content", ['{"text": 3}\n', "not json\n", "", "\n\n  \n"])
def test_a_data_file_without_documents_is_refused_naming_it(tmp_path, content):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(ValueError, match="no documents in .*bad.jsonl"):
        Corpus.build(DataConfig(paths=(str(f),)))
    with pytest.raises(ValueError, match="does not exist"):
        Corpus.build(DataConfig(paths=(str(tmp_path / "missing.txt"),)))
    (tmp_path / "bad-tok.json").write_text("{}")
    with pytest.raises(ValueError, match="could not be read|no <eos>"):
        load_tokenizer(tmp_path / "bad-tok.json")


def test_data_config_checks_fields():
    with pytest.raises(ValueError, match="data.seq_len"):
        DataConfig(seq_len=0).validate()
    with pytest.raises(ValueError, match="unknown"):
        DataConfig.from_dict({"seqlen": 3})
