"""A CSV with date and timestamp columns, end to end with no hand edits: `mlops init` recognises a timestamp text, a
day-first date and whole seconds since 1970, `mlops run` derives their year, month, day of week and hour inside the
Transform graph, every exported format agrees with the SavedModel, and the published version takes the raw text.
The header is quoted as R writes it, and one name ('Distance (km)') is read as the feature every format can name."""
import csv
import datetime
import json
import random
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from pipeline import cli
from serving.repository.local import ModelRepository
from tests.conftest import init_and_run

SMALL = ["training.train_steps=400", "training.steps_per_epoch=50", "training.eval_steps=5",
         "optimize.fine_tune_steps=40", "transform.statistics=false", "export.latency_rows=10",
         "beam.direct_running_mode=in_memory"]
ROWS = 480


def write_rides(folder: Path) -> Path:
    """Bike rides: busy on weekends and after 17:00 (what only the derived day of week and hour tell), a timestamp
    text with a few gaps, the day-first return date with one junk cell, and the booking time in seconds."""
    rng = random.Random(11)
    folder.mkdir(parents=True, exist_ok=True)
    start = datetime.datetime(2023, 1, 1, tzinfo=datetime.timezone.utc)
    with open(folder / "rides.csv", "w", newline="") as f:
        # The header as R's write.csv writes it (every name quoted), with a name no model input can carry as is.
        csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_ALL).writerow(
            ["started", "returned_on", "created_at", "Distance (km)", "busy"])
        writer = csv.writer(f, lineterminator="\n")
        for i in range(ROWS):
            moment = start + datetime.timedelta(minutes=rng.randrange(2 * 365 * 24 * 60))
            busy = "yes" if moment.weekday() >= 5 or moment.hour >= 17 else "no"
            returned = moment + datetime.timedelta(days=rng.randint(0, 2))
            writer.writerow([
                "NA" if i % 50 == 7 else f"{moment:%Y-%m-%dT%H:%M:%S}Z",
                "unknown" if i == 100 else f"{returned.day}/{returned.month:02d}/{returned.year}",
                int(moment.timestamp()) - rng.randrange(86400),
                "NA" if i % 40 == 3 else f"{rng.uniform(0.5, 20):.2f}",
                busy,
            ])
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("rides")
    data = write_rides(root / "rides")
    return (*init_and_run(root, data, "busy", SMALL), data)


def test_init_recognises_each_date_and_timestamp_format(project, capsys):
    config, _, _ = project
    assert config.data.datetime_features == {"started": "%Y-%m-%dT%H:%M:%S", "returned_on": "%d/%m/%Y",
                                             "created_at": "%s"}
    assert config.data.numeric_features == ["distance_km"], "the column 'Distance (km)' is the feature distance_km"
    written = Path(config.schema_path).with_name("rides.yaml").read_text()
    assert "started: '%Y-%m-%dT%H:%M:%S'   # strings, " in written
    assert "returned_on: '%d/%m/%Y'   # strings, " in written and "1 cell holds no date and is read as missing" \
        in written, "a junk cell among dates is read as missing, and said so"
    assert "day of week and hour" in written.split("started:")[1].split("\n")[0]
    assert "created_at: '%s'   # integers, " in written and "seconds since 1970 from " in written


def test_the_run_derives_the_date_parts_and_every_format_agrees(project):
    config, summary, _ = project
    assert summary.blessed is True and summary.published_version == 1, summary
    # Weekends and evenings are busy: the model learned them from the derived features alone.
    assert summary.metrics["auc"] > 0.9, summary.metrics
    report = summary.export
    assert report.passed
    for row in report.artifacts:
        if row.check.figure == "max_abs_diff":
            assert row.max_abs_diff <= config.export.max_abs_diff, row
    shipped = json.loads((Path(summary.pushed_path) / "tflite" / "preprocessing.json").read_text())
    dates = {f["name"]: f for f in shipped["features"] if f["kind"] == "datetime"}
    assert set(dates) == {"started", "returned_on", "created_at"}
    assert set(dates["started"]["parts"]) == {"year", "month", "day_of_week", "hour"}
    assert set(dates["returned_on"]["parts"]) == {"year", "month", "day_of_week"}


def test_the_published_version_takes_the_raw_text_over_rest_and_grpc(project, capsys):
    from serving.clients import GrpcClient, RestClient
    from serving.server.model_server import ModelServer

    config, summary, data = project
    with open(data / "rides.csv", newline="") as f:
        rows = list(csv.DictReader(f))[:40]
    requests = [{"started": "" if r["started"] == "NA" else r["started"], "returned_on": r["returned_on"],
                 "created_at": int(r["created_at"]), "distance_km": float("nan") if r["Distance (km)"] == "NA"
                 else float(r["Distance (km)"])} for r in rows]
    saved_model = tf.saved_model.load(summary.pushed_path).signatures["serving_default"]
    expected = saved_model(started=tf.constant([r["started"] for r in requests]),
                           returned_on=tf.constant([r["returned_on"] for r in requests]),
                           created_at=tf.constant([r["created_at"] for r in requests], tf.int64),
                           distance_km=tf.constant([r["distance_km"] for r in requests], tf.float32))["probabilities"]
    repository = ModelRepository(config.serving_base_dir)
    server = ModelServer(config_path=repository.config_path, rest_port=0, grpc_port=0, poll_seconds=0)
    assert server.start() == []
    try:
        server.wait_until_available(config.model_name, 1)
        sent = [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in r.items()} for r in requests]
        with RestClient(server.rest_url) as rest, GrpcClient(server.grpc_target) as grpc:
            by_rest = rest.predict_outputs(sent, config.model_name, version=1)
            by_grpc = grpc.predict_outputs(sent, config.model_name, version=1)
        capsys.readouterr()
        # The training file itself: the label column is left out, NA read as the version's missing marker.
        assert cli.main(["predict", "--rest", server.rest_url, "--model", config.model_name,
                         "--csv", str(data / "rides.csv"), "--repository", config.serving_base_dir]) == 0
        printed = capsys.readouterr()
    finally:
        server.stop()
    np.testing.assert_allclose([a["probabilities"] for a in by_rest], expected.numpy(), atol=1e-6)
    assert by_rest == by_grpc
    assert len([line for line in printed.out.splitlines() if line.strip()]) >= ROWS
