"""`mlops serve`, `mlops predict` and the demo's serve_and_predict."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline.cli import build_parser
from serving.demo import serve_and_predict
from settings.arguments import run_command
from tests.serving.conftest import MODEL, ROW, expected_probability, http_json

REPO_ROOT = Path(__file__).resolve().parents[2]


def mlops(*argv: str) -> int:
    return run_command(build_parser().parse_args(list(argv)))


def test_predict_json_over_rest_by_label(server, capsys):
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--label", "stable", "--json",
                 json.dumps(ROW)) == 0
    assert capsys.readouterr().out.split() == [f"{expected_probability(ROW, 1):.6f}"]


def test_predict_csv_over_grpc_by_version(server, tmp_path, capsys):
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("fare,trip_start_hour,payment_type,tips\n2.5,7,Cash,0.0\n,,,1.5\n")
    assert mlops("predict", "--grpc", server.grpc_target, "--model", MODEL, "--version", "1", "--csv",
                 str(csv_file), "--drop-unknown-features") == 0
    assert capsys.readouterr().out.split() == [
        f"{expected_probability(ROW, 1):.6f}", f"{expected_probability({}, 1):.6f}"
    ]


def test_predict_csv_with_more_rows_than_the_server_s_batch_limit_goes_as_several_requests(server, tmp_path, capsys):
    """The fixture's server refuses more than 8 rows per request; 11 rows 4 at a time come back whole, in order."""
    rows = [(2.5 + i, i % 24) for i in range(11)]
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("fare,trip_start_hour\n" + "".join(f"{fare},{hour}\n" for fare, hour in rows))
    expected = [f"{expected_probability({'fare': fare, 'trip_start_hour': hour}, 1):.6f}" for fare, hour in rows]
    for transport in (["--rest", server.rest_url], ["--grpc", server.grpc_target]):
        assert mlops("predict", *transport, "--model", MODEL, "--version", "1", "--csv", str(csv_file),
                     "--rows-per-request", "4") == 0
        assert capsys.readouterr().out.split() == expected
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--csv", str(csv_file)) == 1
    assert "larger than the maximum batch size 8" in capsys.readouterr().err
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--csv", str(csv_file),
                 "--rows-per-request", "0") == 2
    assert "rows_per_request must be at least 1" in capsys.readouterr().err


def test_predict_errors_are_one_line_and_an_exit_code(server, capsys):
    assert mlops("predict", "--rest", server.rest_url, "--model", "nope", "--json", json.dumps(ROW)) == 1
    assert "Servable not found" in capsys.readouterr().err
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--json", "{fare: 1}") == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert mlops("predict", "--grpc", server.grpc_target, "--model", MODEL, "--json", '{"fare": "x"}') == 1
    assert "'fare' expects DT_FLOAT" in capsys.readouterr().err


def test_serve_refuses_incomplete_arguments(tmp_path, capsys):
    assert mlops("serve", "--model-name", MODEL) == 2
    assert "--model-base-path" in capsys.readouterr().err
    assert mlops("serve", "--model-config", str(tmp_path / "missing.config")) == 2
    assert "does not exist" in capsys.readouterr().err
    assert mlops("serve", "--model-base-path", str(tmp_path), "--model-name", "../x") == 2
    assert "is invalid" in capsys.readouterr().err


def test_serve_refuses_unusable_batching_and_limit_flags(repository, tmp_path, capsys):
    config = ["serve", "--model-config", str(repository.config_path), "--rest-port", "0", "--grpc-port", "0"]
    parameters = tmp_path / "batching.txt"
    parameters.write_text("max_batch_size { value: 64 }")
    assert mlops(*config, "--batching_parameters_file", str(parameters)) == 2
    assert "applies only with --enable_batching" in capsys.readouterr().err
    parameters.write_text("max_batch_size: 64")
    assert mlops(*config, "--enable_batching", "--batching_parameters_file", str(parameters)) == 2
    assert "not a valid text-format BatchingParameters" in capsys.readouterr().err
    assert mlops(*config, "--enable-batching", "--batching-parameters-file", str(tmp_path / "nope.txt")) == 2
    assert "does not exist" in capsys.readouterr().err
    assert mlops(*config, "--max_num_load_retries", "-1") == 2
    assert "must not be negative" in capsys.readouterr().err
    assert mlops(*config, "--max-in-flight-requests", "0") == 2
    assert "--max-in-flight-requests must be at least 1" in capsys.readouterr().err


def test_predict_csv_with_more_fields_than_the_header_is_a_usage_error(server, tmp_path, capsys):
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("fare,trip_start_hour,payment_type\n2.5,7,Cash\n2.5,7,Cash,extra\n")
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--csv", str(csv_file)) == 2
    err = capsys.readouterr().err
    assert "line 3 has 4 fields but the header names 3" in err
    assert len(err.strip().splitlines()) == 1


def test_serve_handles_sigterm_before_the_ports_open(repository, monkeypatch, capsys):
    from serving.server.model_server import ModelServer

    before = signal.getsignal(signal.SIGTERM)
    seen_at_start = []

    def start(self):
        seen_at_start.append(signal.getsignal(signal.SIGTERM))
        raise OSError("no ports today")

    monkeypatch.setattr(ModelServer, "start", start)
    assert mlops("serve", "--model-config", str(repository.config_path), "--rest-port", "0", "--grpc-port", "0") == 1
    assert "no ports today" in capsys.readouterr().err
    # A SIGTERM while the server starts (before the ready line) must stop it cleanly, not kill the process.
    assert seen_at_start and callable(seen_at_start[0]) and seen_at_start[0] is not before
    assert signal.getsignal(signal.SIGTERM) is before


def _readline(stream, timeout_s: float) -> str:
    """One line from `stream`, or AssertionError after `timeout_s` (a hung child must fail the test, not block it)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if reader.is_alive():
        raise AssertionError(f"no line within {timeout_s}s")
    return lines[0]


def test_mlops_serve_runs_until_sigterm(repository, tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    stderr_path = tmp_path / "serve.stderr"
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "serve", "--model-config", str(repository.config_path),
             "--rest-port", "0", "--grpc-port", "0", "--poll-seconds", "0.2", "--enable_batching",
             "--batching_parameters_file", str(REPO_ROOT / "k8s" / "serving" / "base" / "batching_parameters.txt"),
             "--max_num_load_retries", "1", "--load_retry_interval_micros", "200000"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    try:
        try:
            line = _readline(process.stdout, 120)  # the server is up (or the process died: an empty line)
            assert line.startswith("serving REST on http://127.0.0.1:"), line
            rest_url = line.split()[3]
            assert _readline(process.stdout, 10) == "request logging off (serving.request_log.enabled)\n"
            status, body = http_json("GET", f"{rest_url}/v1/models/{MODEL}/labels/canary")
            assert status == 200 and body["model_version_status"][0]["version"] == "2"
            status, body = http_json("POST", f"{rest_url}/v1/models/{MODEL}:predict", {"instances": [ROW]})
            assert status == 200 and body["predictions"] == pytest.approx([expected_probability(ROW, 2)])
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
            assert "server stopped" in _readline(process.stdout, 10)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            raise AssertionError(f"{e}\n--- mlops serve stderr ---\n{stderr_path.read_text()[-4000:]}") from e
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        process.stdout.close()


def test_serve_and_predict_prints_a_rest_and_a_grpc_prediction(repository, capsys):
    serve_and_predict(str(repository.base_dir), MODEL, {**ROW, "tips": 1.0})
    out = capsys.readouterr().out
    # The stable label's version answers, not the highest loaded one (version 2, the canary).
    expected = f"{expected_probability(ROW, 1):.6f}"
    assert "version 1 (label stable)" in out
    assert f"REST prediction: {expected}" in out
    assert f"gRPC prediction: {expected}" in out
    assert out.rstrip().endswith("server stopped")


def test_serve_and_predict_without_a_pushed_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the pipeline first"):
        serve_and_predict(str(tmp_path), MODEL, ROW)


def test_predict_csv_on_a_training_file_applies_the_versions_markers_and_drops_its_label(server, repository,
                                                                                          tmp_path, capsys):
    # The version's own publication.json, as the Publisher writes it from the export report.
    (Path(repository.version_dir(MODEL, 1)) / "publication.json").write_text(json.dumps(
        {"request": {"missing_values": ["NA", "n.d."], "label_columns": ["tips"]}}))
    csv_file = tmp_path / "train.csv"
    csv_file.write_text("fare,trip_start_hour,payment_type,trip_id,tips\n2.5,7,Cash,a1,0.0\nNA,n.d.,NA,a2,1.5\n")
    flags = ["--model", MODEL, "--version", "1", "--csv", str(csv_file), "--repository", str(repository.base_dir)]
    assert mlops("predict", "--rest", server.rest_url, *flags) == 0
    captured = capsys.readouterr()
    # 'NA' in payment_type is a string cell: read as missing too, as ExampleGen read the training file.
    assert captured.out.split() == [f"{expected_probability(ROW, 1):.6f}", f"{expected_probability({}, 1):.6f}"]
    assert captured.err.splitlines() == [
        f"note: left out the label column tips of {csv_file}: the model predicts it",
        f"note: left out column trip_id of {csv_file}: the model does not take them",
    ]
    csv_file.write_text('fare,trip_start_hour,payment_type,tips\n2.5,7,"Cash\nor card",0.0\n3.0,unknown,Cash,1\n')
    assert mlops("predict", "--grpc", server.grpc_target, *flags) == 2
    message = capsys.readouterr().err.splitlines()[-1]
    assert message == (f"error: {csv_file} line 4 (row 2), column 'trip_start_hour': 'unknown' is not a DT_INT64 "
                       "value; fix the cell or leave it empty for missing (this version reads 'NA', 'n.d.' as "
                       "missing).")
    csv_file.write_text("fare,trip_start_hour,payment_type\n2.5,seven,Cash\n")
    assert mlops("predict", "--rest", server.rest_url, *flags) == 2
    assert f"error: {csv_file} line 2 (row 1), column 'trip_start_hour'" in capsys.readouterr().err
    # A version whose record lists no markers says so; only a version without a record asks for --repository.
    (Path(repository.version_dir(MODEL, 1)) / "publication.json").write_text(json.dumps(
        {"request": {"missing_values": [], "label_columns": ["tips"]}}))
    assert mlops("predict", "--rest", server.rest_url, *flags) == 2
    assert capsys.readouterr().err.rstrip().endswith("(this version reads only empty cells as missing: its "
                                                     "data.missing_values list is empty).")
    (Path(repository.version_dir(MODEL, 1)) / "publication.json").write_text(json.dumps({}))
    assert mlops("predict", "--rest", server.rest_url, *flags) == 2
    assert capsys.readouterr().err.rstrip().endswith("(no data.missing_values of this version were found (pass "
                                                     "--repository with the model repository to apply them)).")


@pytest.mark.parametrize("transport", ["--rest", "--grpc"])
def test_predict_json_reads_the_versions_markers_as_missing(server, repository, capsys, transport):
    """A --json row copied from the training data ('NA' where a number was not measured) answers as the gap
    ExampleGen made of it; without the version's record the same row is refused with what to do."""
    (Path(repository.version_dir(MODEL, 1)) / "publication.json").write_text(json.dumps(
        {"request": {"missing_values": ["NA", "n.d."], "label_columns": ["tips"]}}))
    address = server.rest_url if transport == "--rest" else server.grpc_target
    rows = [ROW, {"fare": "NA", "trip_start_hour": " n.d.", "payment_type": "NA"}, {"fare": "n.d.x"}]
    flags = ["predict", transport, address, "--model", MODEL, "--version", "1"]
    assert mlops(*flags, "--json", json.dumps(rows[:2]), "--repository", str(repository.base_dir)) == 0
    assert capsys.readouterr().out.split() == [f"{expected_probability(ROW, 1):.6f}",
                                               f"{expected_probability({}, 1):.6f}"]
    assert mlops(*flags, "--json", json.dumps(rows[2]), "--repository", str(repository.base_dir)) != 0
    assert "'n.d.x'" in capsys.readouterr().err
    assert mlops(*flags, "--json", json.dumps(rows[1]), "--repository", str(repository.base_dir / "elsewhere")) != 0
    assert "leave it empty for missing" in capsys.readouterr().err


def test_predict_json_with_an_unknown_key_names_the_flag_that_drops_it(server, capsys):
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--json",
                 json.dumps({**ROW, "tips": 1.0})) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --json row 1 has keys the model does not take: tips; its inputs are fare, payment_type, "
        "trip_start_hour (drop those keys, or pass --drop-unknown-features).")
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--json", json.dumps({**ROW, "tips": 1.0}),
                 "--drop-unknown-features") == 0


def test_predict_json_takes_the_csv_columns_own_names(server, capsys):
    # "Trip Start Hour" and "FARE" as the user's CSV header spells them: the inputs they became answer.
    assert mlops("predict", "--rest", server.rest_url, "--model", MODEL, "--json", json.dumps(ROW)) == 0
    expected = capsys.readouterr().out
    own_names = {"FARE": ROW["fare"], "Trip Start Hour": ROW["trip_start_hour"], "payment_type": ROW["payment_type"]}
    assert mlops("predict", "--grpc", server.grpc_target, "--model", MODEL, "--json", json.dumps(own_names)) == 0
    assert capsys.readouterr().out == expected


# What `mlops predict` must not import: TensorFlow (the official TF Serving protos would run tensorflow/__init__.py),
# the pipeline's libraries, and the config loader (predict reads no pipeline config).
PREDICT_NEVER_IMPORTS = ("tensorflow", "tensorflow_serving.apis", "tf_keras", "keras", "tfx", "apache_beam", "pandas",
                         "pyarrow", "settings.config", "yaml")


def test_mlops_predict_over_either_transport_imports_no_tensorflow(server, repository, tmp_path):
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("fare,trip_start_hour,payment_type,tips\n2.5,7,Cash,1.0\n")
    row = ["--json", json.dumps(ROW)]
    calls = [["predict", "--rest", server.rest_url, "--model", MODEL, "--label", "stable", *row],
             ["predict", "--grpc", server.grpc_target, "--model", MODEL, "--label", "stable", *row],
             ["predict", "--grpc", server.grpc_target, "--model", MODEL, "--version", "1", "--csv", str(csv_file),
              "--repository", str(repository.base_dir)]]
    # A fresh process, as the `mlops` command is: the codes, the predictions and the imported modules come back.
    script = ("import json, sys\nfrom pipeline.cli import main\n"
              "codes = [main(call) for call in json.loads(sys.argv[1])]\n"
              "print(json.dumps({'codes': codes, 'modules': sorted(sys.modules)}))")
    done = subprocess.run([sys.executable, "-c", script, json.dumps(calls)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    *predictions, last = done.stdout.splitlines()
    result = json.loads(last)
    assert result["codes"] == [0, 0, 0]
    assert predictions == [f"{expected_probability(ROW, 1):.6f}"] * 3
    modules = set(result["modules"])
    assert {"grpc", "serving.clients.transports", "serving.clients.protos"} <= modules  # the gRPC path did run here
    imported = sorted(name for name in modules for heavy in PREDICT_NEVER_IMPORTS
                      if name == heavy or name.startswith(heavy + "."))
    assert imported == []
