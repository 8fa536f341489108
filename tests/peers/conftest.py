"""Fixtures for the peers tests."""

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """Trained tokenizers go to a per-session temp dir, never the user's cache (set before any fixture builds one)."""
    old = os.environ.get("SKIPPIPE_CACHE")
    os.environ["SKIPPIPE_CACHE"] = str(tmp_path_factory.mktemp("skippipe-cache"))
    yield
    if old is None:
        os.environ.pop("SKIPPIPE_CACHE", None)
    else:
        os.environ["SKIPPIPE_CACHE"] = old
