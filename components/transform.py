"""The Transform component's `preprocessing_fn`: the graph that is baked into every exported model."""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from components.features import FeatureLayout, transformed_name
from components.label_rule import compute_label
from components.tensors import as_float, as_string, dense_and_present, present_values
from settings.config import DATETIME_ID_PARTS, EPOCH_FORMAT, LabelConfig, datetime_fields

# The vocabulary file holding every analyzer result that is not a vocabulary itself (see record_constants).
CONSTANTS_VOCABULARY = "transform_constants"
# The entry of the recorded constants holding a regression label's mean and standard deviation.
LABEL_CONSTANTS = "__label__"


def label_constants(label: LabelConfig, values: tf.Tensor) -> dict[str, tf.Tensor]:
    """What the model needs to know about the label beyond its values: a regression label's mean and standard
    deviation over the training split (the model predicts z-scores and rescales them)."""
    if label.kind != "regression":
        return {}
    present = tf.boolean_mask(values, tf.logical_not(tf.math.is_nan(values)))
    return {LABEL_CONSTANTS: tf.stack(mean_and_std(present))}


def mean_and_std(present: tf.Tensor, rows: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """The mean and standard deviation (float32) of the present values; with `rows`, the values' count over all
    rows, the deviation once the missing cells are filled with the mean (the variance shrinks by present / all),
    from one pass over the present values, so that the constants need no second analysis phase.

    Accumulated in float64: TF Transform combines per-batch moments, and Beam sizes batches by timing, so float32
    sums would differ in the last bit from run to run, and so would the model built on them."""
    mean, variance = tft.mean(present, output_dtype=tf.float64), tft.var(present, output_dtype=tf.float64)
    if rows is not None:
        variance *= tf.cast(tft.size(present), tf.float64) / tf.cast(tft.size(tf.ones([rows])), tf.float64)
    return tf.cast(mean, tf.float32), tf.cast(tf.sqrt(variance), tf.float32)


def record_constants(constants: dict[str, tf.Tensor], like: tf.Tensor) -> None:
    """Writes analyzer results (feature name -> float32 tensor) to a file of the Transform output, so that runtimes
    without TF Transform (TFLite, ONNX, TF.js) repeat this step exactly (components/exporter/preprocessing.py).

    A vocabulary is the only analyzer result TF Transform writes as a file. Every row (shaped like `like`) carries
    the same token, `base64(name)=base64(serialized tensor)` pairs joined by commas, so the file holds that token.
    """
    pairs = [
        tf.strings.join([tf.io.encode_base64(name), "=", tf.io.encode_base64(tf.io.serialize_tensor(value))])
        for name, value in sorted(constants.items())
    ]
    token = tf.strings.reduce_join(tf.stack(pairs), separator=",")
    tft.vocabulary(tf.fill(tf.shape(like)[:1], token), vocab_filename=CONSTANTS_VOCABULARY)


def z_score(x: tf.Tensor, mean: tf.Tensor, std: tf.Tensor) -> tf.Tensor:
    return tf.where(std > 0, (x - mean) / tf.where(std > 0, std, 1.0), x - mean)


def bucket_ids(x: tf.Tensor, boundaries: tf.Tensor) -> tf.Tensor:
    """Bucket i holds boundaries[i-1] <= x < boundaries[i]: the number of boundaries at or below x."""
    return tf.reduce_sum(tf.cast(x[:, tf.newaxis] >= boundaries[tf.newaxis, :], tf.int64), axis=1)


def category_ids(x: tf.Tensor, largest_id: tf.Tensor) -> tf.Tensor:
    """Integer values used as ids: 0 to largest_id stay as they are; missing (filled with -1), negative and larger
    values get the one out-of-range id, largest_id + 1."""
    return tf.where(tf.logical_and(x >= 0, x <= largest_id), x, largest_id + 1)


# The fewest and most digits of each field: a year has four, the others one or two.
FIELD_DIGITS = {"year": (4, 4), "month": (1, 2), "day": (1, 2), "hour": (1, 2)}
SECONDS_PER_DAY = 86400


def civil_days(year: tf.Tensor, month: tf.Tensor, day: tf.Tensor) -> tf.Tensor:
    """Days since 1970-01-01 of a proleptic Gregorian date (int64; Howard Hinnant's days_from_civil)."""
    y = year - tf.cast(month <= 2, tf.int64)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def civil_from_days(days: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Year, month and day of the date `days` after 1970-01-01 (int64; Howard Hinnant's civil_from_days)."""
    z = days + 719468
    era = z // 146097
    day_of_era = z - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = tf.where(shifted_month < 10, shifted_month + 3, shifted_month - 9)
    return year_of_era + era * 400 + tf.cast(month <= 2, tf.int64), month, day


def days_in_month(year: tf.Tensor, month: tf.Tensor) -> tf.Tensor:
    # tf.equal, not ==: in TF1 graph mode (the pipeline's Transform) == compares the tensor objects.
    leap = tf.logical_or(tf.logical_and(tf.equal(year % 4, 0), tf.not_equal(year % 100, 0)), tf.equal(year % 400, 0))
    lengths = tf.constant([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], tf.int64)
    february = tf.logical_and(leap, tf.equal(month, 2))
    return tf.gather(lengths, tf.clip_by_value(month, 1, 12) - 1) + tf.cast(february, tf.int64)


def datetime_values(x: tf.Tensor | tf.SparseTensor, fmt: str) -> dict[str, tf.Tensor]:
    """A date or timestamp column's year, month (1-12), day of week (Monday 0) and hour as int64 [batch], with
    `date_present` and `hour_present` masks. Text: the digit groups in the order the format names the fields; a
    missing cell, a field of the wrong width, or a date that does not exist is missing. %s: whole seconds since
    1970-01-01 UTC, negative ones missing. components/exporter/preprocessing.py and preprocessing.mjs repeat this."""
    fields = datetime_fields(fmt)
    if fmt.strip() == EPOCH_FORMAT:
        seconds, present = dense_and_present(tf.cast(x, tf.int64) if isinstance(x, tf.Tensor) else
                                              tf.SparseTensor(x.indices, tf.cast(x.values, tf.int64), x.dense_shape),
                                              tf.constant(-1, tf.int64))
        date_present = tf.logical_and(present, seconds >= 0)
        seconds = tf.where(date_present, seconds, tf.zeros_like(seconds))
        days = seconds // SECONDS_PER_DAY
        year, month, day = civil_from_days(days)
        hour = (seconds % SECONDS_PER_DAY) // 3600
        return {"year": year, "month": month, "day_of_week": (days + 3) % 7, "hour": hour,
                "date_present": date_present, "hour_present": date_present}
    text, present = dense_and_present(as_string(x), "")
    groups = tf.strings.split(tf.strings.strip(tf.strings.regex_replace(text, "[^0-9]+", " ")), sep=" ")
    table = groups.to_tensor(default_value="", shape=[None, len(fields)])
    values, valid = {}, {}
    for index, name in enumerate(fields):
        if name not in FIELD_DIGITS:
            continue
        group = table[:, index]
        fewest, most = FIELD_DIGITS[name]
        length = tf.strings.length(group)
        valid[name] = tf.logical_and(length >= fewest, length <= most)
        values[name] = tf.strings.to_number(tf.where(valid[name], group, "0"), tf.int64)
    year, month, day = values["year"], values["month"], values["day"]
    date_present = tf.reduce_all(tf.stack([present, valid["year"], valid["month"], valid["day"], month >= 1,
                                           month <= 12, day >= 1, day <= days_in_month(year, month)]), axis=0)
    days = civil_days(year, tf.clip_by_value(month, 1, 12), day)
    hour = values.get("hour", tf.zeros_like(year))
    hour_present = tf.logical_and(date_present, tf.logical_and(valid["hour"], hour <= 23)) if "hour" in valid \
        else tf.zeros_like(date_present)
    return {"year": year, "month": month, "day_of_week": (days + 3) % 7, "hour": hour,
            "date_present": date_present, "hour_present": hour_present}


def datetime_features(x: tf.Tensor | tf.SparseTensor, fmt: str, parts: list[str]
                      ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """The derived features of a date column, by part: the year z-scored like a numeric feature (missing -> the
    training mean), and ids for the others (missing -> one id past the last). Also the year's [fill, mean, std]."""
    values = datetime_values(x, fmt)
    present = values["date_present"]
    year = tf.cast(values["year"], tf.float32)
    present_years = tf.boolean_mask(year, present)
    mean, std = mean_and_std(present_years, tf.shape(year)[0])
    ids = {"month": values["month"] - 1, "day_of_week": values["day_of_week"], "hour": values["hour"]}
    outputs = {"year": z_score(tf.where(present, year, mean), mean, std)}
    for part in parts:
        if part in DATETIME_ID_PARTS:
            mask = values["hour_present"] if part == "hour" else present
            outputs[part] = tf.where(mask, ids[part], tf.cast(DATETIME_ID_PARTS[part], tf.int64))
    return outputs, tf.stack([mean, mean, std])


def preprocessing_fn(inputs: dict[str, Any], custom_config: dict[str, Any]) -> dict[str, tf.Tensor]:
    """Numeric: missing -> mean, then z-score. Coordinates: quantile buckets plus one bucket for missing.
    Strings and ids: vocabulary of the top values plus OOV buckets, missing -> ''. Integer categories: the value
    is the id, up to the training split's largest, plus one id for anything else. Dates and timestamps: the year as
    a number, month, day of week and hour as ids (datetime_features). Label: computed here, per label.kind (0/1, a
    class id, or the number)."""
    layout = FeatureLayout.from_properties(custom_config)
    options = layout.transform
    outputs, constants = {}, {}
    for key in layout.numeric:
        x = as_float(inputs[key])
        present = present_values(x)
        rows = tf.shape(x)[0] if isinstance(x, tf.Tensor) else x.dense_shape[0]
        mean, std = mean_and_std(present, rows)
        filled, _ = dense_and_present(x, mean)
        name = transformed_name(key)
        outputs[name] = z_score(filled, mean, std)
        constants[key] = tf.stack([mean, mean, std])
    for key in layout.bucket:
        x = as_float(inputs[key])
        boundaries = tf.reshape(
            tft.quantiles(present_values(x), num_buckets=options.bucket_count, epsilon=0.01), [-1]
        )
        filled, present = dense_and_present(x, 0.0)
        name = transformed_name(key)
        outputs[name] = tf.where(present, bucket_ids(filled, boundaries), tf.cast(options.bucket_count, tf.int64))
        constants[key] = boundaries
    for key in layout.vocab:
        filled, _ = dense_and_present(as_string(inputs[key]), "")
        outputs[transformed_name(key)] = tft.compute_and_apply_vocabulary(
            filled, top_k=options.vocab_size, num_oov_buckets=options.oov_buckets, vocab_filename=key
        )
    for key in layout.category:
        values = tf.cast(present_values(inputs[key]), tf.int64)
        # A combine analyzer, computed in the same pass as the means and quantiles: no vocabulary phase. The -1
        # keeps each batch non-empty; with no value of 0 or more in the training split, every row gets id 0.
        largest_id = tft.max(tf.concat([values, tf.constant([-1], tf.int64)], axis=0))
        filled, _ = dense_and_present(inputs[key], tf.constant(-1, inputs[key].dtype))
        outputs[transformed_name(key)] = category_ids(tf.cast(filled, tf.int64), largest_id)
        constants[key] = tf.reshape(tf.cast(largest_id, tf.float32), [1])
    for key, fmt in layout.datetime.items():
        derived, year_constants = datetime_features(inputs[key], fmt, layout.datetime_parts(key))
        for part, values in derived.items():
            outputs[transformed_name(f"{key}_{part}")] = values
        constants[f"{key}_year"] = year_constants
    outputs[layout.label_key] = compute_label(inputs, layout.label)
    constants.update(label_constants(layout.label, outputs[layout.label_key]))
    if constants:
        record_constants(constants, outputs[layout.label_key])
    return outputs


def read_constants(tft_output: tft.TFTransformOutput) -> dict[str, list[float]]:
    """The analyzer results record_constants wrote into a Transform output, by feature name."""
    import base64

    try:
        (token,) = tft_output.vocabulary_by_name(CONSTANTS_VOCABULARY)
    except (ValueError, OSError):
        raise ValueError("the Transform output holds no transform_constants file: it was made by an older "
                         "preprocessing_fn; run the pipeline again with --set enable_cache=false.") from None
    recorded = {}
    for pair in token.split(b","):
        name, value = (base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4)) for part in pair.split(b"="))
        recorded[name.decode("utf-8")] = tf.io.parse_tensor(value, tf.float32).numpy().reshape(-1).tolist()
    return recorded
