"""The `mlops run` console, as a user's terminal sees it: the stage lines and the summary, nothing TensorFlow, Beam
or their worker processes print; those land in the run's log. Runs the real command in a subprocess, because the
noise comes from C++ code and child processes writing to file descriptor 2, which no in-process capture sees."""
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import as_cli_flags, small_overrides

# What may reach the console of a successful data-only run, line by line.
CONSOLE_LINES = [
    r"pipeline '\w+': \d+ CSV file\(s\) from .+",
    r"outputs under .+; full log (?P<log>\S+\.log)",
    r"\s*\d+\.\ds  \[\d+/\d+\] \w+ \.\.\.",
    r"\s*\d+\.\ds  \[\d+/\d+\] \w+ done in \d+\.\ds( \(cached\))?",
    r"",
    r"data stages done in \d+\.\ds; report .+\.html",
]
NOISE = ("Traceback", "Exception ignored", "WARNING", "Warning", "I tensorflow/", "W tensorflow/", "E tensorflow/",
         "E external/", "W external/", "I external/")


def mlops(*args: str) -> subprocess.CompletedProcess:
    """`mlops ARGS` as a user's shell runs it: the entry point, its own stdout and stderr, none of the switches that
    quiet TensorFlow and Python in the environment (the command sets its own)."""
    command = [sys.executable, "-c", "from pipeline.cli import console_main; console_main()", *args]
    env = {name: value for name, value in os.environ.items()
           if name not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, env=env)


def test_a_successful_run_prints_only_its_stages_and_summary_and_logs_the_rest(taxi_slice, tmp_path):
    # Multi-processing: Beam's worker processes, each importing TensorFlow, print on the fd 2 they inherit.
    overrides = small_overrides(taxi_slice, tmp_path, "beam.direct_running_mode=multi_processing",
                                "beam.direct_num_workers=1")
    result = mlops("run", "--data-only", *as_cli_flags(overrides))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    unexpected = [line for line in lines if not any(re.fullmatch(pattern, line) for pattern in CONSOLE_LINES)]
    assert unexpected == [], f"console lines beyond the stages and summary: {unexpected}"
    assert sum(" done in " in line for line in lines) >= 5, result.stdout
    log = Path(re.search(CONSOLE_LINES[1], result.stdout)["log"]).read_text()
    # What would have reached the console is in the log: Python's warnings and TensorFlow's C++ log lines.
    assert re.search(r" WARNING py\.warnings: .*Warning: ", log)
    assert re.search(r"^[\d-]+ [\d:.]+: [WE] (tensorflow|external)/\S+\] ", log, re.MULTILINE)


# What a whole run adds after the stage lines: the summary (its figures indented) and, with --serve-after, the
# served model's predictions.
SUMMARY_LINES = [
    r"summary",
    r" {2,}\S.*",
    r"serving the model repository's stable version locally \(TF Serving's REST and gRPC APIs\)",
    r"serving \w+ version \d+ \(label stable\): REST http://127\.0\.0\.1:\d+, gRPC 127\.0\.0\.1:\d+",
    r"(REST|gRPC) prediction: \S.*",
    r"server stopped",
]


def test_a_whole_run_that_serves_after_prints_only_stages_summary_and_predictions(taxi_slice, tmp_path):
    # Keras prints every epoch on stdout and TensorFlow logs C++ lines while the served model loads: both go to the
    # run's log, not the console.
    result = mlops("run", "--serve-after", *as_cli_flags(small_overrides(taxi_slice, tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    patterns = [pattern for pattern in CONSOLE_LINES if not pattern.startswith("data stages")] + SUMMARY_LINES
    unexpected = [line for line in lines if not any(re.fullmatch(pattern, line) for pattern in patterns)]
    assert unexpected == [], f"console lines beyond the stages, the summary and the predictions: {unexpected}"
    assert "server stopped" in lines and any(line.startswith("gRPC prediction: ") for line in lines)
    log = Path(re.search(CONSOLE_LINES[1], result.stdout)["log"]).read_text()
    assert re.search(r"^Epoch 1/\d+$", log, re.MULTILINE), "Keras's epoch lines are in the log"


def test_init_prints_only_its_own_lines(taxi_slice, tmp_path):
    # Importing TFX logs Python warnings (google.cloud's, for one) before any stage runs: they go to init's log too.
    result = mlops("init", "--data", str(taxi_slice), "--label", "tips", "--output", str(tmp_path / "project"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert not [word for word in NOISE if word in result.stdout], result.stdout
    assert re.search(r"\[3/3\] SchemaGen done in \d+\.\ds", result.stdout)


def test_a_failing_run_still_prints_its_error_sentence(taxi_slice, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    with open(taxi_slice / "data.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows[::50]:
        row["payment_type"] = "Bitcoin"
    with open(bad / "data.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = mlops("run", "--data-only", *as_cli_flags(small_overrides(bad, tmp_path / "outputs")))
    assert result.returncode == 3
    assert result.stderr.startswith("stopped by the data-validation gate: ")
    assert "payment_type" in result.stderr
    assert re.search(r"\[\d+/\d+\] \w+ FAILED", result.stdout)
    for text in (result.stdout, result.stderr):
        assert not [word for word in NOISE if word in text], text
    log = Path(re.search(CONSOLE_LINES[1], result.stdout)["log"]).read_text()
    assert re.search(r"Traceback \(most recent call last\):(.|\n)*DataValidationError: ", log)

