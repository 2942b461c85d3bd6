"""The Transform step as data plus NumPy, for runtimes that cannot run the TF Transform graph.

TFLite, ONNX and TF.js artifacts hold the model over transformed features; this module (and its JavaScript twin,
preprocessing.mjs) turns the raw request the SavedModel's `serving_default` takes into those features, with the
constants the Transform analyzers computed. `build_spec` reads them from the Transform output; `preprocess`
needs only NumPy, so this file is shipped beside the TFLite and ONNX artifacts as it is.

A request is one array per raw feature; a missing value is NaN (or None) for floats, '' for strings and -1 for
integers, as for the SavedModel, or one of the training CSV's missing-value markers (the spec's `missing_values`).
`postprocess` turns the converted model's output back into what the SavedModel answers: for a multiclass model the
class names (the spec's `task.classes`) beside the probabilities.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SPEC_FILE = "preprocessing.json"
SPEC_VERSION = 1


class RequestError(ValueError):
    """A request lacks a feature or holds a value of the wrong type."""


def build_spec(transform_output_dir: str, layout: Any) -> dict[str, Any]:
    """The preprocessing spec of a Transform output: per feature its kind, raw type and the analyzer results.
    `layout` is the run's components.features.FeatureLayout (not imported here: this file ships with NumPy only)."""
    import tensorflow as tf
    import tensorflow_transform as tft

    from components.features import transformed_name
    from components.tasks import task_from_transform
    from components.transform import read_constants
    from settings.config import DATETIME_ID_PARTS, datetime_fields

    tft_output = tft.TFTransformOutput(transform_output_dir)
    raw_spec = tft_output.raw_feature_spec()
    recorded = read_constants(tft_output)

    def constants(key: str) -> list[float]:
        return [float(v) for v in recorded[key]]

    def raw_type(key: str) -> dict[str, Any]:
        spec = raw_spec[key]
        dtype = {tf.float32: "float", tf.int64: "int", tf.string: "string"}[spec.dtype]
        return {"dtype": dtype, "optional": not isinstance(spec, tf.io.FixedLenFeature)}

    features = []
    for key in layout.numeric:
        fill, mean, std = constants(key)
        features.append({"name": key, "kind": "numeric", **raw_type(key), "fill": fill, "mean": mean, "std": std})
    for key in layout.bucket:
        features.append({"name": key, "kind": "bucket", **raw_type(key), "boundaries": constants(key),
                         "missing_id": layout.transform.bucket_count})
    for key in layout.vocab:
        if raw_spec[key].dtype == tf.float32:
            raise ValueError(f"vocabulary feature '{key}' is a float column, whose text form only TensorFlow "
                             "reproduces; list it under data.numeric_features or data.bucket_features.")
        vocabulary = [v.decode("utf-8") for v in tft_output.vocabulary_by_name(key)]
        features.append({"name": key, "kind": "vocab", **raw_type(key), "vocabulary": vocabulary,
                         "oov_id": len(vocabulary)})
    for key in layout.category:
        if raw_spec[key].dtype != tf.int64:
            raise ValueError(f"category feature '{key}' is not an integer column; list it under "
                             "data.vocab_features.")
        (largest_id,) = constants(key)
        features.append({"name": key, "kind": "category", **raw_type(key), "max_id": int(largest_id),
                         "oov_id": int(largest_id) + 1})
    for key, fmt in layout.datetime.items():
        if raw_spec[key].dtype == tf.float32:
            raise ValueError(f"date feature '{key}' is a float column; a timestamp in seconds must be an integer "
                             "column, and a date text.")
        fill, mean, std = constants(f"{key}_year")
        parts = {"year": {"fill": fill, "mean": mean, "std": std}}
        parts.update({part: {"missing_id": DATETIME_ID_PARTS[part]} for part in layout.datetime_parts(key)
                      if part in DATETIME_ID_PARTS})
        features.append({"name": key, "kind": "datetime", **raw_type(key), "fields": datetime_fields(fmt),
                         "parts": parts})
    return {"version": SPEC_VERSION, "output_suffix": transformed_name(""), "features": features,
            "task": task_from_transform(layout.label, tft_output).describe(),
            "missing_values": [m.strip() for m in layout.data.missing_values if m.strip()]}


def transformed_inputs(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """The transformed features `preprocess` makes, in order, with their dtypes: "float32" or "int32"."""
    inputs = []
    for feature in spec["features"]:
        if feature["kind"] == "datetime":
            inputs += [(f"{feature['name']}_{part}{spec['output_suffix']}", "float32" if part == "year" else "int32")
                       for part in feature["parts"]]
        else:
            inputs.append((feature["name"] + spec["output_suffix"],
                           "float32" if feature["kind"] == "numeric" else "int32"))
    return inputs


def save_spec(spec: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)


def load_spec(path: str) -> dict[str, Any]:
    with open(path) as f:
        spec = json.load(f)
    if spec.get("version") != SPEC_VERSION:
        raise ValueError(f"{path} is preprocessing spec version {spec.get('version')}; this code reads "
                         f"version {SPEC_VERSION}.")
    return spec


def _column(columns: Mapping[str, Sequence[Any]], feature: dict[str, Any]) -> np.ndarray:
    name, dtype = feature["name"], feature["dtype"]
    if name not in columns:
        raise RequestError(f"the request lacks feature '{name}'; send one value per row ({dtype}).")
    values = columns[name]
    try:
        if dtype == "float":
            return np.array([np.nan if v is None else v for v in values], dtype=np.float32)
        if dtype == "int":
            return np.array([-1 if v is None else v for v in values], dtype=np.int64)
        return np.array(["" if v is None else (v.decode("utf-8") if isinstance(v, bytes) else str(v))
                         for v in values], dtype=object)
    except (TypeError, ValueError, OverflowError) as e:
        raise RequestError(f"feature '{name}' must hold {dtype} values: {e}.") from None


def marker_numbers(markers: Sequence[str], integer: bool) -> list[float]:
    """The missing-value markers that are numbers (whole numbers only for an integer column)."""
    numbers = []
    for marker in markers:
        try:
            number = float(marker)
        except ValueError:
            continue
        if not integer or number.is_integer():
            numbers.append(number)
    return numbers


def _marked_missing(values: np.ndarray, feature: dict[str, Any], markers: Sequence[str]) -> np.ndarray:
    """An optional feature's cells holding one of the training CSV's missing-value markers (which ExampleGen read as
    empty cells) as the gap of its dtype: '', NaN or -1."""
    if not markers or not feature["optional"]:
        return values
    if feature["dtype"] == "string":
        return np.array(["" if v.strip() in markers else v for v in values], dtype=object)
    numbers = marker_numbers(markers, feature["dtype"] == "int")
    if not numbers:
        return values
    return np.where(np.isin(values, numbers), np.nan if feature["dtype"] == "float" else -1, values
                    ).astype(values.dtype)


def _as_float(values: np.ndarray, feature: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """float32 values and the mask of present ones, as the Transform graph sees them."""
    if feature["dtype"] == "int":
        present = values != -1 if feature["optional"] else np.ones(values.shape, dtype=bool)
        return values.astype(np.float32), present
    return values, ~np.isnan(values)


def _as_text(values: np.ndarray, feature: dict[str, Any]) -> np.ndarray:
    if feature["dtype"] == "int":
        missing = values == -1 if feature["optional"] else np.zeros(values.shape, dtype=bool)
        return np.array(["" if m else str(int(v)) for v, m in zip(values, missing, strict=True)], dtype=object)
    return values


# The digits a field may have (transform.FIELD_DIGITS) and the days of each month.
FIELD_DIGITS = {"year": (4, 4), "month": (1, 2), "day": (1, 2), "hour": (1, 2)}
MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
SECONDS_PER_DAY = 86400


def _civil_days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 (Howard Hinnant's days_from_civil, as transform.civil_days)."""
    y = year - (month <= 2)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    return era * 146097 + year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    z = days + 719468
    era = z // 146097
    day_of_era = z - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def datetime_value(value: Any, fields: list[str]) -> tuple[tuple[int, int, int, int] | None, bool]:
    """(year, month, day of week with Monday 0, hour) of one cell, or None when it is missing, and whether the hour
    is present: transform.datetime_values for one value."""
    if fields == ["epoch"]:
        if value < 0:
            return None, False
        days, seconds = divmod(int(value), SECONDS_PER_DAY)
        year, month, _ = _civil_from_days(days)
        return (year, month, (days + 3) % 7, seconds // 3600), True
    groups = re.sub(r"[^0-9]+", " ", value).strip().split(" ")
    groups += [""] * (len(fields) - len(groups))
    parsed = {}
    for name, group in zip(fields, groups, strict=False):
        if name in FIELD_DIGITS:
            fewest, most = FIELD_DIGITS[name]
            parsed[name] = int(group) if fewest <= len(group) <= most else None
    year, month, day = parsed["year"], parsed["month"], parsed["day"]
    if year is None or month is None or day is None or not 1 <= month <= 12:
        return None, False
    leap = (year % 4 == 0 and year % 100 != 0) or year % 400 == 0
    if not 1 <= day <= MONTH_DAYS[month - 1] + (leap and month == 2):
        return None, False
    hour = parsed.get("hour")
    hour_present = hour is not None and hour <= 23
    return (year, month, (_civil_days(year, month, day) + 3) % 7, hour if hour_present else 0), hour_present


def _datetime_outputs(values: np.ndarray, feature: dict[str, Any], suffix: str) -> dict[str, np.ndarray]:
    parts = feature["parts"]
    if feature["dtype"] == "int":
        cells = [datetime_value(int(v), feature["fields"]) for v in values]
    else:
        cells = [datetime_value(v, feature["fields"]) for v in values]
    year = parts["year"]
    years = np.array([np.float32(date[0]) if date else np.float32(year["fill"]) for date, _ in cells],
                     dtype=np.float32)
    mean, std = np.float32(year["mean"]), np.float32(year["std"])
    name = feature["name"]
    outputs = {f"{name}_year{suffix}": (years - mean) / std if std > 0 else years - mean}
    index = {"month": 1, "day_of_week": 2, "hour": 3}
    for part, settings in parts.items():
        if part == "year":
            continue
        missing = settings["missing_id"]
        ids = [(date[index[part]] - (part == "month")) if date and (part != "hour" or has_hour) else missing
               for date, has_hour in cells]
        outputs[f"{name}_{part}{suffix}"] = np.array(ids, dtype=np.int32)
    return outputs


def preprocess(spec: dict[str, Any], columns: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """Transformed features for a batch of raw rows: `<name>_xf` arrays of shape [rows, 1], float32 for numeric
    features and int32 ids for buckets, vocabularies and categories (the dtypes the exported TFLite, ONNX and
    TF.js take); a date feature gives `<name>_year_xf` (float32) and the ids of its month, day of week and hour."""
    outputs = {}
    rows = None
    markers = spec.get("missing_values", [])
    for feature in spec["features"]:
        values = _marked_missing(_column(columns, feature), feature, markers)
        if rows is not None and len(values) != rows:
            raise RequestError(f"feature '{feature['name']}' has {len(values)} values, others {rows}; send one "
                               "value per row for every feature.")
        rows = len(values)
        kind = feature["kind"]
        if kind == "numeric":
            x, present = _as_float(values, feature)
            filled = np.where(present, x, np.float32(feature["fill"])).astype(np.float32)
            mean, std = np.float32(feature["mean"]), np.float32(feature["std"])
            out = (filled - mean) / std if std > 0 else filled - mean
        elif kind == "bucket":
            x, present = _as_float(values, feature)
            filled = np.where(present, x, np.float32(0.0))
            boundaries = np.array(feature["boundaries"], dtype=np.float32)
            ids = (filled[:, None] >= boundaries[None, :]).sum(axis=1)
            out = np.where(present, ids, feature["missing_id"]).astype(np.int32)
        elif kind == "datetime":
            for name, out in _datetime_outputs(values, feature, spec["output_suffix"]).items():
                outputs[name] = out.reshape(-1, 1)
            continue
        elif kind == "category":
            # Compared as int64 before the int32 cast, so a huge value is out of range instead of wrapping.
            out = np.where((values >= 0) & (values <= feature["max_id"]), values, feature["oov_id"]).astype(np.int32)
        else:
            index = {token: i for i, token in enumerate(feature["vocabulary"])}
            oov = feature["oov_id"]
            out = np.array([index.get(token, oov) for token in _as_text(values, feature)], dtype=np.int32)
        outputs[feature["name"] + spec["output_suffix"]] = out.reshape(-1, 1)
    return outputs


def postprocess(spec: dict[str, Any], output: Any) -> dict[str, np.ndarray]:
    """What the SavedModel's serving_default answers, from the converted model's output: a binary model's
    `probabilities` [rows]; a multiclass model's `probabilities` [rows, classes], the predicted `class` name [rows]
    and the `classes` names [rows, classes]; a regression model's `value` [rows]."""
    task = spec.get("task") or {"kind": "binary", "output": "probabilities"}
    values = np.asarray(output, dtype=np.float32)
    if task["kind"] != "multiclass":
        return {task["output"]: values.reshape(-1)}
    classes = np.array(task["classes"], dtype=object)
    probabilities = values.reshape(-1, len(classes))
    return {task["output"]: probabilities, "class": classes[np.argmax(probabilities, axis=1)],
            "classes": np.tile(classes, (len(probabilities), 1))}
