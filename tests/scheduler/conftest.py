from pathlib import Path

import numpy as np
import pytest

from scheduler.instance import load_instance

ASSETS = Path(__file__).parent.parent / "assets"


@pytest.fixture(scope="session")
def reference():
    """The paper's 20-node geo-distributed instance, with the reference simulator's per-op gaps."""
    return load_instance(ASSETS / "reference-geo20.json", reference_gaps=True)


def stage_array(instance) -> np.ndarray:
    stage_of = np.full(instance.tables.num_peers, -1)
    for s, part in enumerate(instance.partitions):
        stage_of[list(part)] = s
    return stage_of
