"""The config checked against the schema and the CSV files before any TFX stage runs: each mismatch stops `mlops run`
with one sentence naming the column and the key to set, exit code 2, and nothing written."""
import json
from pathlib import Path

import pytest
import yaml

from pipeline import cli
from pipeline.data import DataError, check_csv_folder
from pipeline.preflight import check_config
from settings.config import load_config

CSV = ("distance,count,city,note,tipped\n"
       "1.5,3,Paris,a,yes\n"
       "NA,4,Rome,b,no\n"
       "2.0,,Oslo,c,no\n"
       "NA,5,,d,yes\n"
       "3.5,6,Rome,e,no\n")
SCHEMA_TYPES = {"distance": "FLOAT", "count": "INT", "city": "BYTES", "tipped": "BYTES"}


def schema_text(types: dict[str, str]) -> str:
    return "".join(f'feature {{\n  name: "{name}"\n  type: {kind}\n}}\n' for name, kind in types.items())


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """A CSV folder, its schema and a config that fits both; output_root below tmp_path/out."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rides.csv").write_text(CSV)
    (tmp_path / "schema.pbtxt").write_text(schema_text(SCHEMA_TYPES))
    config = {"name": "rides", "model_name": "rides", "output_root": str(tmp_path / "out"),
              "schema_path": "schema.pbtxt",
              "data": {"path": str(tmp_path / "data"), "missing_values": ["NA"], "numeric_features": ["distance"],
                       "vocab_features": ["city", "count"]},
              "label": {"column": "tipped", "kind": "binary", "positive_value": "yes"}}
    (tmp_path / "rides.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def run_fails(project: Path, capsys, *overrides: str) -> str:
    """`mlops run` on the project's config with overrides: exit code 2, nothing written, the one-line message."""
    flags = [flag for override in overrides for flag in ("--set", override)]
    assert cli.main(["run", "--config", str(project / "rides.yaml"), *flags]) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("error: ") and "\n" not in message and message.endswith(".")
    # Nothing but the run report, which says what failed, where and what to do.
    written = {p.name for p in (project / "out").rglob("*") if p.is_file()}
    assert written == {"summary.json", "summary.html", "index.html"}, written
    folder = max(p for p in (project / "out" / "runs").iterdir() if p.is_dir())
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["failed_stage"] == "checking the data and the config"
    assert summary["failure"] == message
    assert "failed in checking the data and the config" in (project / "out" / "runs" / "index.html").read_text()
    return message


def test_a_config_that_fits_passes(project):
    config = load_config(project / "rides.yaml")
    check_config(config, check_csv_folder(Path(config.data.path)))
    check_config(config)


def test_numeric_feature_typed_as_string_in_the_schema_names_the_values_and_the_marker_key(project, capsys):
    # The schema TFDV infers from raw CSV without markers: the column with NA is a string.
    (project / "schema.pbtxt").write_text(schema_text({**SCHEMA_TYPES, "distance": "BYTES"}))
    message = run_fails(project, capsys, "data.missing_values=[]")
    assert "data.numeric_features lists 'distance'" in message
    assert "types it as BYTES (a string)" in message
    assert "'NA' (2 cells, first at rides.csv line 3)" in message
    assert "add them to data.missing_values" in message and "mlops init" in message


def test_bucket_feature_typed_as_string_with_strings_only_says_where_to_move_it(project, capsys):
    message = run_fails(project, capsys, "data.bucket_features=[city]", "data.vocab_features=[count]")
    assert message == (f"error: data.bucket_features lists 'city', which must hold numbers, but the schema "
                       f"{project / 'schema.pbtxt'} types it as BYTES (a string), with values such as 'Rome' (2 "
                       "cells, first at rides.csv line 3), 'Paris' (1 cell, first at rides.csv line 2), 'Oslo' (1 "
                       "cell, first at rides.csv line 4); move it to data.vocab_features.")


def test_undeclared_marker_in_a_numeric_schema_column_names_it(project, capsys):
    message = run_fails(project, capsys, "data.missing_values=[]")
    assert message.startswith(f"error: column 'distance' is FLOAT in the schema {project / 'schema.pbtxt'}, but "
                              f"the CSV files in {project / 'data'} hold values that are not numbers: 'NA' (2 cells, "
                              "first at rides.csv line 3)")
    assert message.endswith("; if they mark missing values, add them to data.missing_values, else correct those "
                            "cells.")


def test_a_declared_marker_is_not_an_odd_value(project):
    config = load_config(project / "rides.yaml", ["data.missing_values=[' NA ', '?']"])
    check_config(config, check_csv_folder(Path(config.data.path)))


def test_non_integer_in_an_integer_schema_column(project, capsys):
    (project / "data" / "rides.csv").write_text(CSV.replace("5,,d", "5.5,,d"))
    message = run_fails(project, capsys)
    assert "column 'count' is INT in the schema" in message
    assert "values that are not integers: '5.5' (1 cell, first at rides.csv line 5)" in message


def test_label_column_that_is_not_in_the_csv(project, capsys):
    message = run_fails(project, capsys, "label.column=tiped")
    assert message == (f"error: label.column names 'tiped', which is not a column of the CSV files in "
                       f"{project / 'data'}; set label.column to one (columns: distance, count, city, note, tipped).")


def test_feature_that_is_not_in_the_csv(project, capsys):
    message = run_fails(project, capsys, "data.numeric_features=[distance, distnce]")
    assert message.startswith("error: data.numeric_features lists 'distnce', which is not a column of the CSV files")
    assert message.endswith("; fix or remove it (columns: distance, count, city, note, tipped).")


def test_feature_the_schema_does_not_describe(project, capsys):
    message = run_fails(project, capsys, "data.vocab_features=[city, note]")
    assert message == (f"error: data.vocab_features lists 'note', which the schema {project / 'schema.pbtxt'} does "
                       "not describe; add it to the schema (or write a new one with `mlops init`), or remove it from "
                       "data.vocab_features.")


def test_a_category_feature_must_be_an_integer_column(project, capsys):
    check_config(load_config(project / "rides.yaml", ["data.vocab_features=[city]", "data.category_features=[count]"]))
    for column, typed in (("city", "BYTES (a string)"), ("distance", "FLOAT")):
        message = run_fails(project, capsys, "data.numeric_features=[]", "data.vocab_features=[]",
                            f"data.category_features=[{column}]")
        assert message == (f"error: data.category_features lists '{column}', whose values are used as ids, but the "
                           f"schema {project / 'schema.pbtxt'} types it as {typed}; move it to data.vocab_features.")


@pytest.mark.parametrize("column, fmt, typed, remedy", [
    ("city", "%s", "BYTES (a string)", "write the format its text has, such as %Y-%m-%d"),
    ("count", "%Y-%m-%d", "INT", "use %s for whole seconds since 1970"),
    ("distance", "%Y-%m-%d", "FLOAT", "list it under data.numeric_features"),
])
def test_a_date_feature_must_be_text_or_whole_seconds(project, capsys, column, fmt, typed, remedy):
    check_config(load_config(project / "rides.yaml", ["data.vocab_features=[count]",
                                                      "data.datetime_features={city: '%Y-%m-%d'}"]))
    check_config(load_config(project / "rides.yaml", ["data.vocab_features=[city]",
                                                      "data.datetime_features={count: '%s'}"]))
    message = run_fails(project, capsys, "data.numeric_features=[]", "data.vocab_features=[]",
                        f"data.datetime_features={{{column}: '{fmt}'}}")
    needed = "INT" if fmt == "%s" else "BYTES (a string)"
    assert message == (f"error: data.datetime_features reads '{column}' as '{fmt}', which needs {needed} cells, but "
                       f"the schema {project / 'schema.pbtxt'} types it as {typed}; {remedy}.")


def test_a_date_feature_must_be_a_column(project, capsys):
    message = run_fails(project, capsys, "data.datetime_features={when: '%Y-%m-%d'}")
    assert message.startswith("error: data.datetime_features lists 'when', which is not a column of the CSV files")


def test_string_label_compared_with_a_threshold(project, capsys):
    message = run_fails(project, capsys, "label.positive_value=")
    assert message.startswith("error: label.column 'tipped' is compared with label.threshold, but the schema")
    assert "with values such as 'no' (3 cells, first at rides.csv line 3), 'yes' (2 cells" in message
    assert message.endswith("set label.positive_value to the value that counts as positive, or label.kind to "
                            "multiclass for more than two classes.")


def test_regression_on_a_string_label(project, capsys):
    message = run_fails(project, capsys, "label.kind=regression", "label.positive_value=")
    assert message.startswith("error: label.kind is regression, which needs a numeric label, but for label.column "
                              "'tipped' the schema")


def test_relative_to_must_be_numeric(project, capsys):
    message = run_fails(project, capsys, "label.column=distance", "label.positive_value=", "label.relative_to=city",
                        "data.numeric_features=[count]", "data.vocab_features=[tipped]")
    assert message.startswith("error: label.relative_to names 'city', which must hold numbers")


def test_unreadable_schema(project, capsys):
    (project / "schema.pbtxt").write_text("feature { name: ")
    message = run_fails(project, capsys)
    assert message.startswith(f"error: schema file {project / 'schema.pbtxt'} is not a readable schema text file")


def test_compile_and_submit_check_the_schema_too(project, capsys):
    with pytest.raises(DataError, match="which the schema .* does not describe"):
        check_config(load_config(project / "rides.yaml", ["data.vocab_features=[city, note]"]))
    assert cli.main(["compile", "kubeflow", "--config", str(project / "rides.yaml"), "--set",
                     "data.vocab_features=[city, note]", "--output", str(project / "kfp.yaml")]) == 2
    assert "does not describe" in capsys.readouterr().err
    assert not (project / "kfp.yaml").exists()
    # Refused before anything is compiled or sent: the host is never reached.
    assert cli.main(["submit", "kubeflow", "--config", str(project / "rides.yaml"), "--set",
                     "data.vocab_features=[city, note]", "--host", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err.startswith("error: data.vocab_features lists 'note', which the schema")
