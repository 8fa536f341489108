import pytest

from scheduler.path_rules import PathRules, path_violation, valid_stage_sequences


def test_reference_rules_accept_and_reject():
    rules = PathRules(6, 4)
    assert path_violation((1, 2, 3), rules) is None
    assert path_violation((2, 1, 3), rules) is None  # one swap of distance 1
    assert "visited twice" in path_violation((1, 1, 3), rules)
    assert "swap distance 2" in path_violation((3, 1, 2), rules)
    assert "max_jump" in path_violation((5, 4, 3), rules)
    assert "R-1 = 3" in path_violation((1, 2), rules)
    assert "not a non-zero stage" in path_violation((0, 1, 2), rules)
    assert "max_swaps" in path_violation((2, 1, 4, 3), PathRules(6, 5, max_swaps=1))


def test_enumeration_is_exactly_the_valid_paths():
    rules = PathRules(6, 4)
    seqs = valid_stage_sequences(rules)
    assert len(set(seqs)) == len(seqs)
    assert all(path_violation(s, rules) is None for s in seqs)
    import itertools

    brute = [p for p in itertools.permutations(range(1, 6), 3) if path_violation(p, rules) is None]
    assert sorted(brute) == sorted(seqs)


def test_no_reordering_when_swaps_are_off():
    seqs = valid_stage_sequences(PathRules(8, 5, max_swaps=0))
    assert all(list(s) == sorted(s) for s in seqs)


@pytest.mark.parametrize("bad", [dict(num_stages=0, stages_per_path=1), dict(num_stages=4, stages_per_path=5),
                                 dict(num_stages=4, stages_per_path=2, max_jump=0)])
def test_bad_rules_are_refused(bad):
    with pytest.raises(ValueError):
        PathRules(**bad)


def test_skip_ratio():
    assert PathRules.from_skip_ratio(6, 0.33).stages_per_path == 4
    assert PathRules.from_skip_ratio(6, 0.0).stages_per_path == 6
    with pytest.raises(ValueError):
        PathRules.from_skip_ratio(6, 1.0)
