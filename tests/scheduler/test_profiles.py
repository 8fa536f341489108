import json

import numpy as np
import pytest

from scheduler.profiles import ProfileError, load_profile, preset, random_swarm, swarm_from
from tests.scheduler.conftest import ASSETS

REFERENCE_ACTIVATION_BYTES = 33554648  # what the reference sent per microbatch


def test_geo_preset_reproduces_the_reference_link_costs():
    view = preset("geo-distributed", 20)
    ref = np.array(json.loads((ASSETS / "reference-geo20.json").read_text())["link_seconds"])
    assert np.allclose(view.message_seconds(REFERENCE_ACTIVATION_BYTES), ref, atol=1e-6)


def test_presets_have_the_expected_regions():
    assert {p.region for p in preset("5-clusters", 10).peers} == {"LA", "NL", "Germany", "Singapore", "Oregon"}
    single = preset("single-cluster", 4)
    off = ~np.eye(4, dtype=bool)
    assert np.allclose(single.latency[off], 0.001) and np.allclose(single.bandwidth[off], 2 * 1024**3)


def test_random_swarm_is_seeded_heterogeneous_and_asymmetric():
    a, b = random_swarm(30, seed=5), random_swarm(30, seed=5)
    assert np.array_equal(a.bandwidth, b.bandwidth)
    speeds = [p.seconds_per_layer for p in a.peers]
    assert 1.5 < max(speeds) / min(speeds) <= 4.0
    assert not np.allclose(a.bandwidth, a.bandwidth.T)
    off = ~np.eye(30, dtype=bool)
    assert a.bandwidth[off].min() >= 5e6 and a.bandwidth[off].max() <= 1e9
    assert not np.array_equal(random_swarm(30, seed=6).bandwidth, a.bandwidth)


def test_toml_profile_with_region_links(tmp_path):
    f = tmp_path / "lab.toml"
    f.write_text('''
message_overhead = 0.05
[[peers]]
id = "gpu-a"
region = "lab"
seconds_per_layer = 0.02
data_holder = true
[[peers]]
id = "gpu-b"
region = "home"
[[links]]
a = "lab"
b = "home"
latency_ms = 20
bandwidth_mib_per_s = 12.5
''')
    view = load_profile(f)
    assert view.ids == ["gpu-a", "gpu-b"] and view.peers[0].data_holder
    assert view.latency[0, 1] == pytest.approx(0.02) and view.bandwidth[1, 0] == pytest.approx(12.5 * 1024**2)


def test_json_profile_with_asymmetric_matrices(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"peers": [{"id": "a"}, {"id": "b"}], "latency_ms": [[0, 10], [30, 0]],
                             "bandwidth_mib_per_s": [[0, 100], [5, 0]]}))
    view = load_profile(f)
    assert view.latency[1, 0] == pytest.approx(0.03) and view.bandwidth[1, 0] < view.bandwidth[0, 1]


@pytest.mark.parametrize("content, message", [
    ("peers = 3", "list `peers`"),
    ('[[peers]]\nid = "a"\nseconds_per_layer = -1', "seconds_per_layer must be positive"),
    ('[[peers]]\nid="a"\nregion="x"\n[[peers]]\nid="b"\nregion="y"', "no link measurement"),
    ('[[peers]]\nid="a"\n[[peers]]\nid="a"', "appears twice"),
    ("not toml [", "malformed"),
])
def test_bad_profile_files_fail_clearly(tmp_path, content, message):
    f = tmp_path / "bad.toml"
    f.write_text(content)
    with pytest.raises(ProfileError, match=message):
        load_profile(f)


def test_json_matrix_with_zero_bandwidth_is_refused(tmp_path):
    f = tmp_path / "z.json"
    f.write_text(json.dumps({"peers": [{"id": "a"}, {"id": "b"}], "latency_ms": [[0, 1], [1, 0]],
                             "bandwidth_mib_per_s": [[0, 0], [1, 0]]}))
    with pytest.raises(ProfileError, match="non-positive bandwidth on link a -> b"):
        load_profile(f)


def test_unknown_preset():
    with pytest.raises(ProfileError, match="unknown profile"):
        swarm_from("mars", 4)
