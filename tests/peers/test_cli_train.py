"""`skippipe swarm inprocess` and `skippipe eval` end to end on a very small run (belongs with tests/swarm later)."""

import json

from click.testing import CliRunner

from swarm.cli.train import eval_command, swarm

SMALL_RUN = ["inprocess", "--peers", "3", "--stages", "3", "--skip", "0", "--batch-size", "2", "--seq-len", "16",
             "--microbatches", "1", "--eval-every", "1"]


def test_inprocess_trains_checkpoints_resumes_and_evaluates(tmp_path):
    runner = CliRunner()
    metrics, ck = tmp_path / "m.jsonl", tmp_path / "ck"
    res = runner.invoke(swarm, [*SMALL_RUN, "--iterations", "2", "--metrics", str(metrics), "--checkpoint", str(ck)])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [1, 2]
    assert all(r["loss"] > 0 and r["tokens_per_s"] > 0 and "val_loss" in r for r in lines)

    res = runner.invoke(swarm, [*SMALL_RUN, "--iterations", "3", "--metrics", str(metrics), "--checkpoint", str(ck)])
    assert res.exit_code == 0, res.output
    assert "resumed from" in res.output and "at iteration 2" in res.output
    assert [json.loads(x)["iteration"] for x in metrics.read_text().splitlines()] == [1, 2, 3]

    res = runner.invoke(eval_command, [str(ck), "--omit", "0.5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["iteration"] == 3 and out["perplexity"] > 1 and out["perplexity_omitted"] > 1
    assert out["kept_stages"] == 1


def test_bad_cli_input_is_a_one_line_error(tmp_path):
    runner = CliRunner()
    res = runner.invoke(swarm, ["inprocess", "--stages", "7"])
    assert res.exit_code != 0 and "at most 6 stages" in res.output
    res = runner.invoke(swarm, ["inprocess", "--peers", "2", "--stages", "3"])
    assert res.exit_code != 0 and "at least one peer per stage" in res.output
    res = runner.invoke(eval_command, [str(tmp_path)])
    assert res.exit_code != 0 and "not a checkpoint directory" in res.output
