"""`mlops init`: a raw CSV folder with its own missing-value markers and gaps becomes a schema the data-validation gate
accepts on that same data, and a starter config that loads and runs the data stages."""
import csv
import random
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from pipeline import cli
from pipeline.data import COMMON_MISSING_MARKERS, ColumnProfile, DataError, profile_columns
from pipeline.init.bootstrap import (
    FORMATTED_NUMBER,
    SENTINEL_MIN_GAP,
    SENTINEL_MIN_SHARE,
    Placement,
    _percent,
    blessing_bound,
    check_number_formats,
    datetime_format,
    find_sentinel,
    finish_schema,
    infer_label,
    monitoring_lines,
    place_features,
    propose_junk_markers,
    propose_markers,
    propose_sentinel_markers,
    read_as_markers,
    regression_tolerances,
)
from settings.config import (
    TOLERANCE_KEYS,
    ConfigError,
    MonitoringConfig,
    MonitoringFeatureConfig,
    load_config,
    tolerance_note,
    usable_name,
)

HEADER = ["house_id", "age", "income", "city", "rooms", "country", "note", "bought"]


def write_houses(folder: Path, rows: int = 160) -> Path:
    """A public-looking CSV: 'NA' and '?' in numeric columns, empty cells, '-' as a value of a string column."""
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "houses.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(HEADER)
        for i in range(rows):
            age = "NA" if i % 17 == 0 else "" if i % 23 == 0 else str(rng.randint(18, 90))
            # Moderate incomes and a few huge ones: a long tail.
            income = f"{rng.lognormvariate(10, 0.5):.2f}" if i % 40 != 1 else "4000000.00"
            income = "NA" if i % 13 == 0 else "?" if i % 29 == 0 else income
            city = "" if i % 11 == 0 else rng.choice(["Paris", "Rome", "Oslo", "Lima"])
            rooms = "" if i % 19 == 0 else str(rng.randint(1, 6))
            note = rng.choice(["-", "garden", "garage"])
            bought = "yes" if rng.random() < 0.4 else "no"
            writer.writerow([f"h{i:04d}", age, income, city, rooms, "FR", note, bought])
    return folder


def test_init_writes_a_schema_the_gate_accepts_on_the_same_data_and_a_config_that_runs(tmp_path, capsys):
    data = write_houses(tmp_path / "houses")
    out = tmp_path / "project"
    assert cli.main(["init", "--data", str(data), "--label", "bought", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    config_path, schema_path = out / "houses.yaml", out / "houses_schema.pbtxt"
    assert "data.missing_values: [NA, '?']" in printed
    assert "'-' only in string columns (note " in printed, "a marker among strings is a value there: not proposed"
    assert "label bought: strings, 2 distinct values" in printed and "binary, positive_value 'yes'" in printed
    assert printed.rstrip().endswith(f"review these two files, then `mlops run --config {config_path}`")

    config = load_config(config_path)
    assert config.data.missing_values == ["NA", "?"]
    assert config.data.calibration_buckets == 1, "a classifier's config sets rows aside to calibrate on"
    # A first run has no baseline, and TFX blesses nothing without a threshold: the config carries one.
    assert (config.evaluation.lower_bound, config.evaluation.upper_bound) == (0.6, None)
    assert list(config.evaluation.no_skill) == ["log_loss"], "and it must beat the base rate's log loss"
    assert config.schema_path == str(schema_path)
    assert (config.label.column, config.label.kind, config.label.positive_value) == ("bought", "binary", "yes")
    assert config.data.numeric_features == ["age"]
    assert config.data.bucket_features == ["income"], "the long tail goes to quantile buckets"
    assert config.data.vocab_features == ["city", "note"]
    assert config.data.category_features == ["rooms"], "a small set of integers from 1 to 6 is codes, used as ids"
    assert "bought" not in config.features and "house_id" not in config.features and "country" not in config.features
    # `mlops monitor`'s thresholds: every chosen feature at its kind's default (strings categorical, numbers numeric).
    monitoring = config.monitoring
    assert sorted(monitoring.features) == sorted(config.features)
    assert monitoring.features["city"] == MonitoringFeatureConfig(skew=monitoring.categorical_skew,
                                                                  drift=monitoring.categorical_drift)
    for name in ("age", "income", "rooms"):
        assert monitoring.features[name] == MonitoringFeatureConfig(skew=monitoring.numeric_skew,
                                                                    drift=monitoring.numeric_drift), name
    assert (monitoring.categorical_skew, monitoring.numeric_skew) == (MonitoringConfig().categorical_skew,
                                                                     MonitoringConfig().numeric_skew)
    written = config_path.read_text()
    assert "    city:   {skew: 0.1, drift: 0.1}   # categorical" in written
    assert "#   house_id: strings, 160 distinct values in 160 rows: an identifier" in written
    assert "#   country: one value only ('FR')" in written

    schema = text_format.Parse(schema_path.read_text(), schema_pb2.Schema())
    features = {feature.name: feature for feature in schema.feature}
    assert features["age"].type == schema_pb2.INT and features["income"].type == schema_pb2.FLOAT
    for name in ("age", "income", "city", "rooms"):
        # ExampleGen encodes a gap as an empty list: a minimum of one value would reject the data it came from.
        assert not features[name].HasField("shape") and features[name].value_count.min == 0, name
    assert list(features["bought"].not_in_environment) == ["SERVING"]
    # A column the config leaves out keeps no closed list of values; a feature does.
    assert not features["country"].HasField("domain") and features["city"].HasField("domain")
    page = (out / "houses_statistics.html").read_text()
    assert "<h2>Numbers</h2>" in page and "<td>income</td>" in page
    assert "Missing-value markers read as empty cells: &#x27;NA&#x27;, &#x27;?&#x27;" in page

    # The pipeline's own gate (ExampleValidator + DataValidationGate) and Transform on the very same files, but for
    # a country init never saw in the column it left out: nothing the model sees, so no anomaly.
    csv_path = data / "houses.csv"
    csv_path.write_text(csv_path.read_text().replace(",FR,", ",DE,", 20))
    overrides = [f"output_root={tmp_path / 'outputs'}", "beam.direct_running_mode=in_memory",
                 "transform.statistics=false"]
    assert cli.main(["run", "--data-only", "--config", str(config_path),
                     *[flag for o in overrides for flag in ("--set", o)]]) == 0
    assert "DataValidationGate done" in capsys.readouterr().out


def test_the_same_data_without_its_markers_stops_before_tfx_with_the_marker_to_set(tmp_path, capsys):
    data = write_houses(tmp_path / "houses", rows=60)
    out = tmp_path / "project"
    assert cli.main(["init", "--data", str(data), "--label", "bought", "--output", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["run", "--config", str(out / "houses.yaml"), "--set", "data.missing_values=[NA]",
                     "--set", f"output_root={tmp_path / 'outputs'}"]) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("error: column 'income' is FLOAT in the schema") and "\n" not in message
    assert "'?' (2 cells, first at houses.csv line 31)" in message and "add them to data.missing_values" in message
    written = {p.relative_to(tmp_path / "outputs").parts[0] for p in (tmp_path / "outputs").rglob("*") if p.is_file()}
    assert written == {"runs"}, "nothing but the report of the failed run"


def test_init_refuses_what_the_user_must_fix_and_writes_nothing(tmp_path, capsys):
    data = write_houses(tmp_path / "houses", rows=20)
    out = tmp_path / "project"
    assert cli.main(["init", "--data", str(data), "--label", "price", "--output", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --label 'price' is not a column of the CSV files in {data}; "
                                               f"choose one of {', '.join(HEADER)}.")
    assert cli.main(["init", "--data", str(data), "--label", "country", "--output", str(out)]) == 2
    assert "holds one value only ('FR'), so there is nothing to predict" in capsys.readouterr().err
    assert not out.exists()
    out.mkdir()
    (out / "houses.yaml").write_text("mine")
    assert cli.main(["init", "--data", str(data), "--label", "bought", "--output", str(out)]) == 2
    assert "already exists; pass --force to replace them" in capsys.readouterr().err
    assert (out / "houses.yaml").read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["houses.yaml"]


def test_markers_are_proposed_only_where_the_other_values_are_numbers(tmp_path):
    (tmp_path / "d.csv").write_text("a,b,c\nNA,x,null\n1,NA,2\n2.5,-,NaN\n,y,3\n")
    profiles = profile_columns([tmp_path / "d.csv"], COMMON_MISSING_MARKERS)
    assert profiles["a"].markers == Counter({"NA": 1}) and profiles["a"].empty == 1
    proposed, notes = propose_markers(profiles)
    assert proposed == ["NA", "null", "NaN"]
    assert notes[0] == "'NA' in numeric columns (a 1 cell); also read as missing in the string columns b 1 cell"
    assert notes[-1].startswith("'-' only in string columns (b 1 cell): not proposed")


def _profile(values: dict[str, int], empty: int = 0) -> ColumnProfile:
    profile = ColumnProfile("y", rows=sum(values.values()) + empty, empty=empty, values=Counter(values))
    return profile


@pytest.mark.parametrize("values, schema_type, kind, keys", [
    ({"yes": 5, "no": 9}, schema_pb2.BYTES, "binary", {"positive_value": "yes"}),
    ({"cat": 5, "dog": 2}, schema_pb2.BYTES, "binary", {"positive_value": "dog"}),
    ({"ja": 9, "nein": 5}, schema_pb2.BYTES, "binary", {"positive_value": "ja"}),  # a German export: not the rarer
    ({"Oui": 9, "Non": 5}, schema_pb2.BYTES, "binary", {"positive_value": "Oui"}),
    ({"Sí": 9, "No": 5}, schema_pb2.BYTES, "binary", {"positive_value": "Sí"}),
    ({"0": 5, "1": 2}, schema_pb2.INT, "binary", {"threshold": 0.5}),
    ({"setosa": 5, "versicolor": 5, "virginica": 5}, schema_pb2.BYTES, "multiclass", {}),
    ({str(i): 3 for i in range(7)}, schema_pb2.INT, "multiclass", {}),
    ({str(i): 1 for i in range(40)}, schema_pb2.INT, "regression", {}),
    ({"1.5": 2, "2.25": 1, "7.0": 1}, schema_pb2.FLOAT, "regression", {}),
])
def test_the_task_kind_follows_the_label_column(values, schema_type, kind, keys):
    choice = infer_label(_profile(values, empty=1), schema_type, [])
    assert (choice.kind, choice.keys) == (kind, keys)
    assert kind in choice.reason and "y is missing in 1 row, which `mlops run` leaves out" in choice.reason


def test_the_blessing_bound_beats_guessing_or_predicting_the_mean():
    assert blessing_bound("binary", None)[0] == {"lower_bound": 0.6}
    assert blessing_bound("multiclass", None)[0] == {"lower_bound": 0.6}
    label = statistics_pb2.FeatureNameStatistics(name="y")
    label.num_stats.std_dev = 54.321987
    bounds, reason = blessing_bound("regression", label)
    assert bounds == {"no_skill": {"rmse": 54.32}}
    assert "RMSE of at most 48.89" in reason and "standard deviation" in reason
    # Five classes, the most common on 49% of the rows: accuracy must close a tenth of the gap to 1, and the log
    # loss a tenth of the gap from the class shares' to 0.
    bounds, reason = blessing_bound("multiclass", None, Counter({"a": 49, "b": 20, "c": 15, "d": 10, "e": 6}))
    shares = np.array([0.49, 0.2, 0.15, 0.1, 0.06])
    assert bounds == {"lower_bound": 0.6, "no_skill": {"accuracy": 0.49, "log_loss": round(-np.sum(
        shares * np.log(shares)), 4)}}
    assert "accuracy of at least 0.5410 (always answering 'a' scores 0.49)" in reason
    assert f"log loss of at most {0.9 * bounds['no_skill']['log_loss']:.4f}" in reason
    # Binary: the base rate's log loss (three positives in ten rows), whichever value is positive.
    bounds, _ = blessing_bound("binary", None, Counter({"yes": 3, "no": 7}))
    assert bounds == {"lower_bound": 0.6, "no_skill": {"log_loss": round(-0.3 * np.log(0.3) - 0.7 * np.log(0.7), 4)}}


def test_a_few_gaps_in_many_rows_do_not_read_as_none():
    assert [_percent(share) for share in (0.0, 2 / 15002, 0.0005, 0.093, 0.34)] == ["0.0%", "<0.1%", "0.1%", "9.3%",
                                                                                       "34%"]


@pytest.mark.parametrize("codes, group", [
    (range(0, 24), "category"),  # hours
    (range(1, 8), "category"),  # weekdays: 1 to 7, below twice their count
    ([*range(10), 22], "vocab"),  # 22 is not below twice the 11 values' count ...
    ([*range(10), 21], "category"),  # ... 21 is
    ([-1, 0, 1, 2], "vocab"),  # a negative code has no id of its own
    ([100, 200, 300, 400], "vocab"),  # sparse codes: a vocabulary of four is smaller than 401 ids
])
def test_small_integer_codes_are_ids_when_dense_and_a_vocabulary_otherwise(codes, group):
    values = Counter({str(code): 3 for code in codes})
    profile = ColumnProfile("code", rows=sum(values.values()), values=values, types=Counter(int=sum(values.values())))
    (placement,) = place_features(["code"], "label", {"code": profile}, [], {"code": schema_pb2.INT},
                                  statistics_pb2.DatasetFeatureStatistics())
    assert placement.group == group


def write_penguins(folder: Path, rows: int = 240) -> Path:
    """A numeric label with gaps (body_mass_g: 'NA' and an empty cell) and a numeric column with junk cells
    (bill_depth_mm: 'unknown' and 'n.d.' among the numbers)."""
    rng = random.Random(3)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "penguins.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"])
        for i in range(rows):
            species = rng.choice(["Adelie", "Gentoo", "Chinstrap"])
            flipper = rng.randint(172, 231)
            mass = str(int(flipper * 45 - 4800 + rng.gauss(0, 300)))
            mass = "NA" if i in (5, 77) else "" if i == 130 else mass
            depth = "unknown" if i % 20 == 3 else "n.d." if i % 40 == 9 else f"{rng.uniform(13, 21):.1f}"
            length = "NA" if i % 50 == 7 else f"{rng.uniform(32, 59):.1f}"
            writer.writerow([species, rng.choice(["Biscoe", "Dream", "Torgersen"]), length, depth, flipper, mass])
    return folder


def test_init_on_a_numeric_label_with_gaps_and_a_junk_celled_column(tmp_path, capsys):
    data = write_penguins(tmp_path / "penguins")
    out = tmp_path / "project"
    assert cli.main(["init", "--data", str(data), "--label", "body_mass_g", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    # 1. The rows without a label are left out: init says so, and its statistics count the rows that remain.
    assert "body_mass_g is missing in 3 rows, which `mlops run` leaves out" in printed
    counts = [int(n.replace(",", "")) for n in
              printed.split("the schema accepts the data it came from (")[1].split(")")[0].split()[1::3]]
    assert sum(counts) == 237, printed
    schema = text_format.Parse((out / "penguins_schema.pbtxt").read_text(), schema_pb2.Schema())
    mass = next(f for f in schema.feature if f.name == "body_mass_g")
    assert mass.presence.min_fraction == 1.0 and mass.HasField("shape"), "the label is required in every row"
    # 3. The junk cells: the column, its non-numbers with their counts and first line, proposed as markers.
    assert ("column 'bill_depth_mm' holds numbers in 222 of 240 filled cells; the others are 'unknown' (12 cells, "
            "first at penguins.csv line 5), 'n.d.' (6 cells, first at penguins.csv line 11): proposed as "
            "missing-value markers, so the column stays numeric") in printed
    config = load_config(out / "penguins.yaml")
    assert config.data.missing_values == ["NA", "unknown", "n.d."]
    assert "bill_depth_mm" in config.data.numeric_features + config.data.bucket_features
    assert (mass.type, config.label.kind) == (schema_pb2.INT, "regression")
    # 2. Every tolerance on the eval RMSE is in the label's units: a share of its standard deviation.
    std = config.evaluation.no_skill["rmse"]
    tolerance = config.optimize.max_degradation
    assert tolerance == config.export.max_quantized_degradation == config.evaluation.max_degradation
    assert tolerance == pytest.approx(0.025 * std, rel=0.01) and tolerance > 1, "grams, not 0.01"
    assert "tolerances: optimize.max_degradation, export.max_quantized_degradation, evaluation.max_degradation" \
        in printed


def test_junk_markers_are_not_proposed_where_they_are_values_or_too_many(tmp_path):
    rows = ["x,y,z,note"] + [f"{i},{i}.5,{i},ok" for i in range(30)]
    rows += ["?x,-,a1,fine", "?x,tbd,b2,tbd", "1,2,c3,ok", "2,3,d4,ok", "3,4,e5,ok", "4,5,f6,ok", "5,6,g7,ok"]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    profiles = profile_columns([tmp_path / "d.csv"], COMMON_MISSING_MARKERS)
    proposed, notes = propose_junk_markers(profiles)
    assert proposed == ["?x"], "x's junk is proposed; y's 'tbd' is a value of the string column note"
    assert notes[0].startswith("column 'x' holds numbers in 35 of 37 filled cells; the others are '?x' (2 cells")
    assert "'tbd' (1 cell, first at d.csv line 33): not proposed, as it is a value of the string column note" \
        in notes[1]
    assert "z" in notes[2] and "not proposed, as so many different values are no missing-value marker" in notes[2]
    read_as_markers(profiles, proposed)
    assert profiles["x"].markers["?x"] == 2 and profiles["x"].types["string"] == 0


def test_tolerance_messages_name_every_key_and_init_scales_them_for_a_regression():
    for key in TOLERANCE_KEYS:
        note = tolerance_note(key, "binary")
        assert all(other in note for other in TOLERANCE_KEYS if other != key) and key not in note
    assert "standard deviation is 812.3" in tolerance_note(TOLERANCE_KEYS[0], "regression", "auto", 812.3)
    label = statistics_pb2.FeatureNameStatistics(name="y")
    label.num_stats.std_dev = 812.3
    sections, reason = regression_tolerances("regression", label)
    assert sections == {"optimize": {"max_degradation": 20.3}, "export": {"max_quantized_degradation": 20.3},
                        "evaluation": {"max_degradation": 20.3}}
    assert "2.5% of the label's standard deviation 812.3" in reason
    assert regression_tolerances("binary", label) == ({}, "")


@pytest.mark.parametrize("cells, fmt", [
    (["2021-03-04", "2021-12-31"], "%Y-%m-%d"),
    (["2021-03-04 07:30", "2021-12-31 23:05"], "%Y-%m-%d %H:%M"),
    (["2021-03-04T07:30:00Z", "2021-12-31T23:05:59.250+01:00"], "%Y-%m-%dT%H:%M:%S"),
    (["2021/3/4", "2021/12/31"], "%Y/%m/%d"),
    (["31/12/2021", "4/3/2021"], "%d/%m/%Y"),
    (["12/31/2021", "3/4/2021"], "%m/%d/%Y"),
    (["31-12-2021", "04-03-2021"], "%d-%m-%Y"),
    (["31.12.2021", "4.3.2021 8:15"], "%d.%m.%Y %H:%M"),
])
def test_init_recognises_the_common_date_and_timestamp_formats(cells, fmt):
    recognised = datetime_format("when", Counter(cells), schema_pb2.BYTES)
    assert recognised is not None and recognised[0] == fmt, recognised
    assert ("hour" in recognised[1]) == ("%H" in fmt)


def test_month_and_day_told_apart_only_by_a_field_above_12_and_said_so_otherwise():
    fmt, reason = datetime_format("when", Counter(["3/4/2021", "5/6/2021"]), schema_pb2.BYTES)
    assert fmt == "%m/%d/%Y" and "read month first (write %d/%m/%Y if the day comes first)" in reason
    assert datetime_format("when", Counter(["13/4/2021", "5/13/2021"]), schema_pb2.BYTES) is None, "no order fits"


@pytest.mark.parametrize("cells, why", [
    (["2021-02-30", "2021-03-01"], "a date that does not exist is no date"),
    (["2021-03-04 25:00"] * 2, "no hour 25"),
    (["20210304", "20210305"], "fields side by side are not read"),
    (["3 March 2021", "4 March 2021"], "month names are not read"),
    (["ab-cd", "2021-03-04"], "half the cells are no date"),
])
def test_text_that_is_not_a_date_is_not_proposed_as_one(cells, why):
    assert datetime_format("when", Counter(cells), schema_pb2.BYTES) is None, why


def test_one_junk_cell_in_a_hundred_dates_is_read_as_missing_and_two_are_too_many():
    dates = Counter({f"2021-01-{day:02d}": 4 for day in range(1, 26)} | {"n/a": 1})
    fmt, reason = datetime_format("when", dates, schema_pb2.BYTES)
    assert fmt == "%Y-%m-%d" and reason.endswith("; 1 cell holds no date and is read as missing")
    assert datetime_format("when", dates + Counter({"n/a": 1}), schema_pb2.BYTES) is None


@pytest.mark.parametrize("column, values, epoch", [
    ("created_at", [946684800, 4102444799], True),
    ("trip_start_timestamp", [1400000000, 1500000000], True),
    ("created_at", [946684799, 1500000000], False),        # before 2000: counts, not a time
    ("created_at", [1500000000, 4102444800], False),       # 2100 or later
    ("customer_id", [1400000000, 1500000000], False),      # not named like a time
])
def test_whole_seconds_since_1970_are_recognised_by_name_and_range(column, values, epoch):
    recognised = datetime_format(column, Counter(str(v) for v in values), schema_pb2.INT)
    assert (recognised is not None and recognised[0] == "%s") == epoch, recognised


def test_a_date_column_keeps_no_closed_list_of_values_in_the_schema():
    schema = text_format.Parse('feature { name: "day" type: BYTES domain: "day" } '
                               'feature { name: "city" type: BYTES domain: "city" } '
                               'string_domain { name: "day" value: "2021-01-01" } '
                               'string_domain { name: "city" value: "Oslo" }', schema_pb2.Schema())
    finished = finish_schema(schema, "label", ["day"])
    assert [d.name for d in finished.string_domain] == ["city"]
    assert not finished.feature[0].HasField("domain") and finished.feature[1].domain == "city"


@pytest.mark.parametrize("name", ["Flipper Length (mm)", "flipper.length", "Island", "2nd_try", "_private"])
def test_a_name_no_model_input_can_take_is_refused_by_the_config_with_the_feature_the_column_becomes(name):
    # Every CSV column is read as a feature with such a name (settings/csv_header.py): a hand-written config that
    # lists the header's own name is told which name to list.
    with pytest.raises(ConfigError, match=f"feature '{re.escape(name)}' cannot name a model input .* read as the "
                                          f"feature '{re.escape(usable_name(name))}': list it under that name"):
        load_config(None, [f"data.numeric_features=[fare, '{name}']"])
    load_config(None, [f"data.numeric_features=[fare, {usable_name(name)}]"])


def test_the_monitoring_section_gives_each_feature_its_kinds_thresholds_and_a_date_none():
    lines = monitoring_lines(["fare", "company", "pickup_day"], {"fare": "numeric", "company": "categorical",
                                                                  "pickup_day": "categorical"}, {"pickup_day"})
    defaults = MonitoringConfig()
    assert lines[-3:] == [
        f"    fare:       {{skew: {defaults.numeric_skew}, drift: {defaults.numeric_drift}}}   # numeric",
        f"    company:    {{skew: {defaults.categorical_skew}, drift: {defaults.categorical_drift}}}   # categorical",
        "    pickup_day: {skew: 1.0, drift: 1.0}   # categorical; a date: never flagged by a distance"]
    assert "monitoring:" in lines[1] and "  categorical_skew: 0.1" in lines


def numeric_profile(name: str, cells: list[str]) -> ColumnProfile:
    """A column's profile as profile_columns counts it."""
    values = Counter(cells)
    kinds = Counter(int=sum(n for v, n in values.items() if "." not in v),
                    float=sum(n for v, n in values.items() if "." in v))
    return ColumnProfile(name, rows=len(cells), values=values, types=kinds)


@pytest.mark.parametrize("code, repeats, found", [
    # The other values 10..109, once each: quartiles 34.75 and 84.25, so one interquartile range is 49.5.
    ("158.5", 6, True),   # 49.5 above the highest other value, in 6 of 106 cells (5.7%): a code
    ("158.4", 6, False),  # just less than SENTINEL_MIN_GAP times the spread away: a value
    ("158.5", 5, False),  # in 5 of 105 cells, just under SENTINEL_MIN_SHARE: a few outliers (a long tail), no code
    ("-39.5", 6, True),   # as far below
    ("-1", 6, True),      # close below, but below zero where no other value is: the -1 / -999 convention
    ("5", 6, False),      # close below and not below zero: the bottom of the values
])
def test_a_sentinel_is_a_number_far_outside_the_others_in_many_rows_just_inside_each_threshold(code, repeats, found):
    assert (SENTINEL_MIN_GAP, SENTINEL_MIN_SHARE) == (1.0, 0.05)
    others = [str(v) for v in range(10, 110)]
    profile = numeric_profile("mass", others + [code] * repeats)
    assert find_sentinel(profile) == ((code, repeats, 10.0, 109.0) if found else None)


def test_a_small_counts_top_value_and_a_negative_column_have_no_sentinel():
    # 0 to 3 cars, 3 in a quarter of the rows: one step above 0..2 is not far outside them.
    cars = numeric_profile("garage_cars", ["0"] * 25 + ["1"] * 25 + ["2"] * 25 + ["3"] * 25)
    assert find_sentinel(cars) is None
    # Class ids 0, 1, 2 (iris' target), 0 in a third of the rows: evenly spaced with the others, not a code.
    assert find_sentinel(numeric_profile("target", ["0"] * 50 + ["1"] * 50 + ["2"] * 50)) is None
    # Just beyond the widest step (and the interquartile range, 1): a code again.
    assert find_sentinel(numeric_profile("target", ["8.9"] * 50 + ["10"] * 50 + ["11"] * 50)) == ("8.9", 50, 10, 11)
    # Temperatures below and above zero: -40 in many rows is one of them, however far it is from the rest.
    temperatures = numeric_profile("temperature", [str(v) for v in range(-5, 95)] + ["-40"] * 10)
    assert find_sentinel(temperatures) is None


def test_sentinels_are_proposed_with_their_share_and_range_unless_another_column_holds_them():
    mass = numeric_profile("mass", [str(2700 + 30 * i) for i in range(80)] + ["-999"] * 20)
    (proposed, notes) = propose_sentinel_markers({"mass": mass})
    assert proposed == ["-999"]
    assert notes == ["column 'mass' holds '-999' in 20 cells of 100 filled (20%), far outside its other values (2700 "
                     "to 5070): proposed as a missing-value marker, so that it is filled as a gap, not learned as a "
                     "value (remove it from data.missing_values if it is a real value)"]
    depth = numeric_profile("depth", [str(-999 + i) for i in range(50)])
    proposed, notes = propose_sentinel_markers({"mass": mass, "depth": depth})
    assert proposed == [] and "not proposed, as it is a value of depth too" in notes[0]
    flags = numeric_profile("flag", ["0"] * 50 + ["1"] * 50)
    assert propose_sentinel_markers({"flag": flags}) == ([], []), "a two-valued column has no outside"


def test_features_are_optional_in_the_schema_so_a_request_gap_is_filled_as_training_filled_it():
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    schema = text_format.Parse("""
        feature { name: "mass" type: INT presence { min_fraction: 1.0 } shape { dim { size: 1 } } }
        feature { name: "island" type: BYTES presence { min_fraction: 1.0 } shape { dim { size: 1 } } }
        feature { name: "label" type: FLOAT presence { min_fraction: 1.0 } shape { dim { size: 1 } } }
    """, schema_pb2.Schema())
    finished = finish_schema(schema, "label")
    spec = schema_utils.schema_as_feature_spec(finished).feature_spec
    # A required integer feature would read the client's missing value (-1) as a value: every feature is optional.
    assert isinstance(spec["mass"], tf.io.VarLenFeature) and isinstance(spec["island"], tf.io.VarLenFeature)
    assert isinstance(spec["label"], tf.io.FixedLenFeature)
    assert all(f.presence.min_fraction == 1.0 for f in finished.feature), "the gate still wants every training value"


@pytest.mark.parametrize("cell, formatted", [
    ("1,677.25", True), ("4831,57", True), ("16%", True), ("$1,200", True), ("(1,200.00)", True),
    ("1.234.567,89", True), ("12,5 €", True), ("EUR 12", True), ("1 234", True),
    ("1.2.3", False), ("2024-03-01", False), ("12:30", False), ("A1", False), ("1,2,3", False), ("555 1234", False),
    ("12,34,567", False)])
def test_numbers_formatted_for_people_are_told_from_versions_dates_and_codes(cell, formatted):
    assert bool(FORMATTED_NUMBER.fullmatch(cell)) is formatted


def test_init_stops_on_numbers_formatted_for_people_naming_each_column_and_the_label_too(tmp_path, capsys):
    """A finance export: thousands separators, percents, currency, and a label written the same way. Read as text,
    they would be a vocabulary of amounts or a column left out, and the model would be blessed without them."""
    data = tmp_path / "sales"
    data.mkdir()
    rows = ["revenue,margin,budget,promo,profit"] + [
        f'"{1000 + 37 * i:,}.25",{10 + i % 30}%,"${500 + 100 * (i % 20):,}",{"TRUE" if i % 2 else "FALSE"},'
        f'"{900 + 41 * i:,}.07"' for i in range(60)]
    (data / "sales.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "project"
    assert cli.main(["init", "--data", str(data), "--label", "profit", "--output", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: columns 'revenue' ('1,000.25' (first at ") and "sales.csv line 2)" in error
    assert all(f"'{column}' (" in error for column in ("margin", "budget", "profit")) and "'promo'" not in error
    assert error.endswith("hold numbers formatted for people, which a CSV reader takes for text; re-export the file "
                          "with plain numbers (no thousands separators, currency or percent signs; '.' as the decimal "
                          "point).")
    assert not out.exists()


@pytest.mark.parametrize("cells, stopped", [
    (["12", "7.5"] * 4 + ["1,200"] + ["unknown"] * 2, True),  # 9 of 11 numbers: just over 80%
    (["12", "7.5"] * 4 + ["1,200"] + ["unknown"] * 3, False),  # 9 of 12: junk cells decide (propose_junk_markers)
    (["12", "7.5"] * 5 + ["NA"], False),  # plain numbers and a marker
    (["v1.2.3", "1.2.3", "2.0.1"], False),  # versions are text
])
def test_a_column_is_stopped_when_numbers_formatted_for_people_fill_80_percent_with_the_plain_ones(cells, stopped):
    profile = numeric_profile("amount", cells)
    profile.types = Counter({("string" if not re.fullmatch(r"-?\d+(\.\d+)?", v) else "float"): n
                             for v, n in profile.values.items()})
    profile.markers = Counter({v: profile.values.pop(v) for v in list(profile.values) if v == "NA"})
    if stopped:
        with pytest.raises(DataError, match=r"^column 'amount' \('1,200'\) holds numbers formatted for people"):
            check_number_formats({"amount": profile}, ["NA"])
    else:
        check_number_formats({"amount": profile}, ["NA"])


def _placed(column: str, cells: list[int], more_values: bool = False) -> Placement:
    values = Counter(str(cell) for cell in cells)
    profile = ColumnProfile(column, rows=len(cells), values=values, types=Counter(int=len(cells)),
                            more_values=more_values)
    (placement,) = place_features([column], "label", {column: profile}, [], {column: schema_pb2.INT},
                                  statistics_pb2.DatasetFeatureStatistics())
    return placement


@pytest.mark.parametrize("column, cells, more_values, identifier", [
    ("record", [100000 + 7 * i for i in range(51)], False, True),  # an auto-increment: 51 rows, one step
    ("record", [100000 + 7 * i for i in range(50)], False, False),  # 50 rows: IDENTIFIER_MIN_VALUES
    ("record", [i * i for i in range(51)], False, False),  # all different, uneven: a quantity
    ("customer_id", [i * i for i in range(51)], False, True),  # named like a key
    ("customer_id", [i * i for i in range(51)] + [4], False, False),  # one value twice: not a key
    ("paid", [i * i for i in range(51)], False, False),  # ends in 'id', not named like a key
    ("customer_id", list(range(1001)), True, True),  # more values than a profile counts: the name decides
    ("record", list(range(1001)), True, False),
])
def test_an_integer_identifier_is_left_out_just_past_each_rule(column, cells, more_values, identifier):
    placement = _placed(column, cells, more_values)
    assert (placement.group is None) is identifier, placement
    if identifier:
        assert placement.reason.endswith(": an identifier, which as a number lets the model memorise rows")
    if identifier and not more_values and column == "record":
        assert "each a different value, evenly spaced by 7" in placement.reason


@pytest.mark.parametrize("counts, warned", [
    ({"gold": 40, "silver": 30, "platinum": 9}, "'platinum' 9 rows"),
    ({"gold": 40, "silver": 30, "platinum": 10}, None),  # RARE_CLASS_ROWS
    ({"gold": 40, "silver": 30, "platinum": 1, "iron": 3}, "classes 'platinum' 1 row, 'iron' 3 rows"),
])
def test_a_class_too_rare_to_learn_or_measure_is_warned_of_just_below_ten_rows(counts, warned):
    reason = infer_label(_profile(counts), schema_pb2.BYTES, []).reason
    assert ("WARNING: too few rows to learn or measure" in reason) is (warned is not None)
    if warned:
        assert f"{warned} (a model memorises them" in reason


@pytest.mark.parametrize("missing, warned", [(90, True), (89, False)])
def test_a_feature_missing_in_90_percent_of_rows_is_warned_of(missing, warned):
    cells = [i * 1.5 for i in range(100 - missing)]
    profile = ColumnProfile("score", rows=100, empty=missing, values=Counter(str(c) for c in cells),
                            types=Counter(float=len(cells)))
    (placement,) = place_features(["score"], "label", {"score": profile}, [], {"score": schema_pb2.FLOAT},
                                  statistics_pb2.DatasetFeatureStatistics())
    assert placement.group == "numeric"
    assert ("WARNING: so many gaps leave it little to tell" in placement.reason) is warned
