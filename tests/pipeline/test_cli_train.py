"""`mlops train` before any pipeline run: one sentence that says to run the pipeline first."""
from pipeline import cli


def test_train_without_a_transform_output_says_to_run_the_pipeline(tmp_path, capsys):
    code = cli.main(["train", "--workers", "2", "--set", f"output_root={tmp_path}"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: pipeline 'taxi' has no finished Transform under {tmp_path}; run `mlops run` first."


def test_train_checks_the_worker_count_against_the_batch(tmp_path, capsys):
    assert cli.main(["train", "--workers", "3", "--set", f"output_root={tmp_path}"]) == 2
    assert "must be a multiple of training.workers (3)" in capsys.readouterr().err
