"""`mlops init`: from a folder of raw CSV files to a schema, a starter config and a statistics page.

The data is read by the pipeline's own ExampleGen (with the missing-value markers found in it), StatisticsGen and
SchemaGen, so the schema describes exactly the encoding `mlops run` will validate. The config's choices (the task
kind, each column's feature group) come from the statistics, and each is printed and written beside its key with the
reason, for a person to review.
"""
from __future__ import annotations

import datetime
import itertools
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2, statistics_pb2

from pipeline.data import (
    COMMON_MISSING_MARKERS,
    ColumnProfile,
    DataError,
    cell_type,
    check_csv_folder,
    profile_columns,
    read_csv_header,
)
from reports.statistics_page import statistics_html
from settings.config import (
    EPOCH_FORMAT,
    MONITORING_THRESHOLDS,
    REGRESSION_TOLERANCE_SHARE,
    TOLERANCE_KEYS,
    BeamConfig,
    ConfigError,
    DataConfig,
    EvaluationConfig,
    LabelConfig,
    MonitoringConfig,
    PipelineConfig,
    feature_kind,
    load_config,
)
from settings.tasks import no_skill_bound

SPLITS = ("train", "eval")
# Integer columns with at most this many distinct values are codes (hour, month, category id): a vocabulary, or
# data.category_features when they are dense codes, 0 or more and below twice their count (no vocabulary to compute).
VOCAB_MAX_INTEGER_VALUES = 32
# A string column with more distinct values than this and than half its rows is an identifier or free text.
IDENTIFIER_MIN_VALUES = 50
# An integer column is an identifier (a row number, a database key) when more than IDENTIFIER_MIN_VALUES rows each
# hold a different value, evenly spaced (an auto-increment) or in a column named like a key: as a number it lets the
# model memorise rows and answer a new record's larger key with what the last rows were.
IDENTIFIER_NAME = re.compile(r"(?:^|_)(?:id|key|uuid|idx|index|rownum|row_number)$", re.IGNORECASE)
# An integer label with at most this many distinct values holds class ids; more make it a quantity (regression).
MAX_INTEGER_CLASSES = 20
# A class with fewer rows than this is too rare to learn or measure: init warns.
RARE_CLASS_ROWS = 10
# A feature missing in at least this share of rows tells little once its gaps are filled: init warns.
MOSTLY_MISSING_SHARE = 0.9
# More classes than this are no classification task a starter config should propose.
MAX_CLASSES = 100
# A number whose farthest value lies more than this many times its 10-90% range beyond that range has a long tail:
# quantile buckets keep the outliers from dominating a z-score.
LONG_TAIL_RATIO = 5.0
# TFX blesses nothing without a threshold, and a first run has no baseline: init writes a bound the model must meet.
MIN_AUC = 0.6
# String labels read as the positive answer of a yes/no question.
POSITIVE_WORDS = ("yes", "y", "true", "t", "positive", "pos", "1",
                  # German, Dutch, French, Spanish, Italian, Portuguese, Scandinavian and Slavic exports' yes and true.
                  "ja", "j", "wahr", "waar", "oui", "vrai", "sí", "si", "verdadero", "vero", "sim", "verdadeiro",
                  "sant", "tak", "da", "ano")
# A column whose filled cells are at least this share numbers, the rest at most JUNK_MAX_VALUES distinct strings,
# is a numeric column with junk cells: the strings are proposed as missing-value markers.
MOSTLY_NUMERIC_SHARE = 0.8
JUNK_MAX_VALUES = 5
# A number is a sentinel (a missing-value code such as -999) when it fills at least this share of a numeric
# column's filled cells ...
SENTINEL_MIN_SHARE = 0.05
# ... and lies beyond the column's other values either by at least this many times their interquartile range (9999
# in an age column, 0 in a column of years), or below zero when none of them is (the -1, -99, -999 convention).
# A spread, not the range, so a small count's top value (3 cars beside 0 to 2) stays a value.
SENTINEL_MIN_GAP = 1.0
# A number formatted for people, which a CSV reader (ExampleGen's, and every export format's) reads as text: a
# currency sign or code, thousands separators in groups of three, a decimal comma, a percent sign, parentheses.
_CURRENCY = r"(?:[$€£¥]|EUR|USD|GBP|CHF)"
_DIGITS = r"(?:\d{1,3}(?P<sep>[,.'\u00a0 ])\d{3}(?:(?P=sep)\d{3})*(?:[.,]\d+)?|\d+,\d+|\d+(?:\.\d+)?)"
FORMATTED_NUMBER = re.compile(rf"\(?[-+]?\s*{_CURRENCY}?\s*[-+]?{_DIGITS}\s*%?\s*{_CURRENCY}?\)?")
# Date layouts init recognises: the regular expression of the date, the order of its fields and its separator
# (day.month.year is day first; d/m/y against m/d/y is told apart by a field above 12).
DATE_LAYOUTS = (
    (r"(?P<a>\d{4})-(?P<b>\d{1,2})-(?P<c>\d{1,2})", "ymd", "-"),
    (r"(?P<a>\d{4})/(?P<b>\d{1,2})/(?P<c>\d{1,2})", "ymd", "/"),
    (r"(?P<a>\d{4})\.(?P<b>\d{1,2})\.(?P<c>\d{1,2})", "ymd", "."),
    (r"(?P<a>\d{1,2})/(?P<b>\d{1,2})/(?P<c>\d{4})", "?y", "/"),
    (r"(?P<a>\d{1,2})-(?P<b>\d{1,2})-(?P<c>\d{4})", "?y", "-"),
    (r"(?P<a>\d{1,2})\.(?P<b>\d{1,2})\.(?P<c>\d{4})", "dmy", "."),
)
# An optional time after the date (T or a blank), with seconds, a fraction and a time-zone offset if any.
TIME_PATTERN = r"(?:(?P<sep>[T ])(?P<H>\d{1,2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?"
# A column is a date when at least this share of its filled cells are dates; the others are read as missing.
MIN_DATE_SHARE = 0.99
# An integer column named like a time, with every value in these years' seconds since 1970, is a timestamp.
EPOCH_RANGE = (946684800, 4102444800)  # 2000-01-01 to 2100-01-01 UTC
EPOCH_NAME = re.compile(r"time|date|epoch|_at$|_ts$", re.IGNORECASE)
# The schema type ExampleGen gives a column of each profile kind.
PROFILE_TYPES = {"int": schema_pb2.INT, "float": schema_pb2.FLOAT, "string": schema_pb2.BYTES}
SCHEMA_TYPES = {schema_pb2.INT: "integers", schema_pb2.FLOAT: "numbers", schema_pb2.BYTES: "strings"}


@dataclass(frozen=True)
class Placement:
    """Where a column goes: "numeric", "bucket", "vocab" or "category" (a feature group of data.*), or None (left
    out)."""

    column: str
    group: str | None
    reason: str
    # A date or timestamp's format (group "datetime").
    format: str = ""


@dataclass(frozen=True)
class LabelChoice:
    kind: str
    # The label keys besides column and kind: threshold or positive_value for a binary label.
    keys: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class InitResult:
    config_path: Path
    schema_path: Path
    statistics_path: Path
    missing_values: list[str]
    label: LabelChoice
    placements: list[Placement]


def _cells(count: int) -> str:
    return f"{count:,} cell{'s' * (count != 1)}"


def propose_markers(profiles: dict[str, ColumnProfile]) -> tuple[list[str], list[str]]:
    """The common markers found in columns whose other values are all numbers (there they can only mean "missing"),
    and a note per marker found, saying where and whether it is proposed."""
    in_numbers: dict[str, dict[str, int]] = {}
    in_strings: dict[str, dict[str, int]] = {}
    for profile in profiles.values():
        numbers_otherwise = sum(profile.types.values()) > 0 and not profile.types["string"]
        for marker, count in profile.markers.items():
            (in_numbers if numbers_otherwise else in_strings).setdefault(marker, {})[profile.name] = count
    proposed = [m for m in COMMON_MISSING_MARKERS if m in in_numbers]
    notes = []
    for marker in proposed:
        where = ", ".join(f"{column} {_cells(n)}" for column, n in in_numbers[marker].items())
        note = f"{marker!r} in numeric columns ({where})"
        if marker in in_strings:
            where = ", ".join(f"{column} {_cells(n)}" for column, n in in_strings[marker].items())
            note += f"; also read as missing in the string columns {where}"
        notes.append(note)
    for marker in (m for m in COMMON_MISSING_MARKERS if m in in_strings and m not in in_numbers):
        where = ", ".join(f"{column} {_cells(n)}" for column, n in in_strings[marker].items())
        notes.append(f"{marker!r} only in string columns ({where}): not proposed, as it may be a value there; add it "
                     "to data.missing_values if it means missing")
    return proposed, notes


def _mostly_numeric(profile: ColumnProfile) -> bool:
    """Whether the column's values are numbers but for a few strings (junk cells such as 'unknown' or '?x')."""
    numbers, strings = profile.types["int"] + profile.types["float"], profile.types["string"]
    return bool(strings and numbers) and numbers >= MOSTLY_NUMERIC_SHARE * (numbers + strings)


def propose_junk_markers(profiles: dict[str, ColumnProfile]) -> tuple[list[str], list[str]]:
    """The non-numeric values of mostly-numeric columns, proposed as missing-value markers (otherwise the column
    becomes a string vocabulary, and a number unseen in training an unknown id), and a note per column saying which
    values, how often, where first, and whether they are proposed or why not."""
    proposed: list[str] = []
    notes = []
    for profile in profiles.values():
        if not _mostly_numeric(profile):
            continue
        junk = Counter({v: n for v, n in profile.odd_values.items() if cell_type(v) == "string"})
        numbers = profile.types["int"] + profile.types["float"]
        head = (f"column {profile.name!r} holds numbers in {numbers:,} of {numbers + profile.types['string']:,} "
                f"filled cells; the others are {profile.samples(('string',), count=JUNK_MAX_VALUES)}")
        if len(junk) > JUNK_MAX_VALUES or sum(junk.values()) < profile.types["string"]:
            notes.append(f"{head}, and more: not proposed, as so many different values are no missing-value marker; "
                         "clean the column or list its junk under data.missing_values")
            continue
        # A marker applies to every column: one that is a real value of a string column would be lost there.
        used = sorted({other.name for other in profiles.values() if other is not profile
                       and not _mostly_numeric(other) and other.types["string"] and set(junk) & set(other.values)})
        if used:
            notes.append(f"{head}: not proposed, as {'they are' if len(junk) > 1 else 'it is a'} value"
                         f"{'s' * (len(junk) > 1)} of the string column{'s' * (len(used) > 1)} {', '.join(used)} too; "
                         "clean the column, or add them to data.missing_values if they mean missing everywhere")
            continue
        new = [v for v, _ in junk.most_common() if v not in proposed]
        proposed += new
        notes.append(f"{head}: proposed as missing-value marker{'s' * (len(junk) > 1)}, so the column stays numeric")
    return proposed, notes


def find_sentinel(profile: ColumnProfile) -> tuple[str, int, float, float] | None:
    """The most frequent number of an all-numeric column that lies far outside its other values (SENTINEL_MIN_GAP
    times their interquartile range, or below zero when they are not) in many rows (SENTINEL_MIN_SHARE of the filled
    cells): (the cell, its count, the other values' lowest and highest), or None."""
    if profile.types["string"] or not profile.values:
        return None
    filled = profile.types["int"] + profile.types["float"]
    for cell, count in profile.values.most_common():
        if count < SENTINEL_MIN_SHARE * filled:
            return None
        others = {float(v): n for v, n in profile.values.items() if v != cell}
        if len(others) < 2:
            continue
        value, low, high = float(cell), min(others), max(others)
        gap = max(low - value, value - high)
        if gap <= 0:
            continue
        q1, _, q3 = statistics.quantiles([v for v, n in sorted(others.items()) for _ in range(n)], n=4,
                                         method="inclusive")
        spread = q3 - q1 or high - low
        # Also wider than any step between the other values: class ids 0, 1, 2 are evenly spaced, not a code.
        widest_step = max(b - a for a, b in itertools.pairwise(sorted(others)))
        if (gap >= SENTINEL_MIN_GAP * spread and gap > widest_step) or (value < 0 <= low):
            return cell, count, low, high
    return None


def propose_sentinel_markers(profiles: dict[str, ColumnProfile]) -> tuple[list[str], list[str]]:
    """The sentinels of numeric columns (find_sentinel), proposed as missing-value markers unless the same text is
    an ordinary value of another column (a marker applies to every column), and a note per sentinel found."""
    proposed: list[str] = []
    notes = []
    for profile in profiles.values():
        found = find_sentinel(profile)
        if found is None:
            continue
        cell, count, low, high = found
        filled = profile.types["int"] + profile.types["float"]
        head = (f"column {profile.name!r} holds {cell!r} in {_cells(count)} of {filled:,} filled "
                f"({_percent(count / filled)}), far outside its other values ({low:g} to {high:g})")
        used = sorted(other.name for other in profiles.values()
                      if other is not profile and cell in other.values and (find_sentinel(other) or ("",))[0] != cell)
        if used:
            notes.append(f"{head}: a code for missing? not proposed, as it is a value of {', '.join(used)} too; "
                         "clean the column if it means missing there")
            continue
        if cell not in proposed:
            proposed.append(cell)
        notes.append(f"{head}: proposed as a missing-value marker, so that it is filled as a gap, not learned as a "
                     "value (remove it from data.missing_values if it is a real value)")
    return proposed, notes


def check_number_formats(profiles: dict[str, ColumnProfile], markers: list[str]) -> None:
    """Raises DataError naming each column whose values are numbers, some of them formatted for people, but for
    junk cells as propose_junk_markers reads them: its cells would be read as strings (a vocabulary of amounts, or a
    column left out), and the model would never see the numbers."""
    found = []
    for profile in profiles.values():
        values = _values(profile, markers)
        formatted = {v: n for v, n in values.items() if cell_type(v) == "string" and FORMATTED_NUMBER.fullmatch(v)}
        numbers = sum(n for v, n in values.items() if cell_type(v) != "string") + sum(formatted.values())
        if formatted and numbers >= MOSTLY_NUMERIC_SHARE * sum(values.values()):
            cells = ", ".join(f"{v!r} (first at {profile.first_seen[v]})" if v in profile.first_seen else repr(v)
                              for v, _ in Counter(formatted).most_common(2))
            found.append(f"'{profile.name}' ({cells})")
    if found:
        raise DataError(f"column{'s' * (len(found) > 1)} {'; '.join(found)} hold{'s' * (len(found) == 1)} numbers "
                        "formatted for people, which a CSV reader takes for text; re-export the file with plain "
                        "numbers (no thousands separators, currency or percent signs; '.' as the decimal point).")


def read_as_markers(profiles: dict[str, ColumnProfile], values: list[str]) -> None:
    """Counts the cells holding `values` as markers in every profile, as ExampleGen will read them."""
    for profile in profiles.values():
        for value in values:
            count = profile.values.pop(value, 0)
            if count:
                profile.markers[value] += count
                profile.types[cell_type(value)] -= count
                profile.odd_values.pop(value, None)


def _values(profile: ColumnProfile, markers: list[str]) -> Counter:
    """The column's values once `markers` are read as missing: markers not among them are values."""
    values = Counter(profile.values)
    values.update({m: n for m, n in profile.markers.items() if m not in markers})
    return values


def _missing(profile: ColumnProfile, markers: list[str]) -> int:
    return profile.empty + sum(n for m, n in profile.markers.items() if m in markers)


def _distinct(profile: ColumnProfile, values: Counter) -> str:
    return f"more than {len(values):,}" if profile.more_values else f"{len(values):,}"


def _percent(share: float) -> str:
    if 0 < share < 0.0005:
        return "<0.1%"  # a few gaps in many rows must not read as none
    return f"{share:.1%}" if share < 0.1 else f"{share:.0%}"


def _shares(values: Counter, total: int) -> str:
    shown = ", ".join(f"{v!r} {_percent(n / total)}" for v, n in values.most_common(5))
    return shown + (", ..." if len(values) > 5 else "")


def infer_label(profile: ColumnProfile, schema_type: int, markers: list[str]) -> LabelChoice:
    """The task kind from the label column's type and values, with the reason; DataError when none fits."""
    values = _values(profile, markers)
    column = profile.name
    if not values:
        raise DataError(f"label column '{column}' has no value in any row; choose another --label.")
    if len(values) == 1:
        raise DataError(f"label column '{column}' holds one value only ({next(iter(values))!r}), so there is nothing "
                        "to predict; choose another --label.")
    total = sum(values.values())
    described = f"{SCHEMA_TYPES.get(schema_type, 'values')}, {_distinct(profile, values)} distinct values"
    missing = _missing(profile, markers)
    gaps = (f"; {column} is missing in {missing:,} row{'s' * (missing != 1)}, which `mlops run` leaves out (nothing "
            "to learn or measure there)" if missing else "")
    if len(values) == 2 and schema_type == schema_pb2.BYTES:
        positive, why = _positive_value(values)
        return LabelChoice("binary", {"positive_value": positive},
                           f"{described} ({_shares(values, total)}): binary, positive_value {positive!r} ({why}){gaps}")
    if len(values) == 2:
        low, high = sorted(float(v) for v in values)
        threshold = (low + high) / 2
        return LabelChoice("binary", {"threshold": threshold},
                           f"{described} ({_shares(values, total)}): binary, label = {column} > {threshold:g}, so "
                           f"{high:g} is the positive class{gaps}")
    if schema_type == schema_pb2.BYTES:
        if profile.more_values or len(values) > MAX_CLASSES:
            raise DataError(f"label column '{column}' holds {_distinct(profile, values)} distinct strings, too many "
                            f"classes (at most {MAX_CLASSES}); choose another --label.")
        return LabelChoice("multiclass", {},
                           f"{described} ({_shares(values, total)}): multiclass{gaps}{_rare_classes(values)}")
    if schema_type == schema_pb2.INT and len(values) <= MAX_INTEGER_CLASSES:
        return LabelChoice("multiclass", {},
                           f"{described}, at most {MAX_INTEGER_CLASSES} ({_shares(values, total)}): multiclass, one "
                           f"class per integer (set label.kind: regression to predict it as a number){gaps}"
                           f"{_rare_classes(values)}")
    numbers = [float(v) for v in values]
    return LabelChoice("regression", {},
                       f"{described} from {min(numbers):g} to {max(numbers):g}: regression{gaps}")


def _rare_classes(values: Counter) -> str:
    """A warning naming the classes with fewer than RARE_CLASS_ROWS rows, or ""."""
    rare = [(v, n) for v, n in sorted(values.items(), key=lambda item: (item[1], item[0])) if n < RARE_CLASS_ROWS]
    if not rare:
        return ""
    named = ", ".join(f"{v!r} {n} row{'s' * (n != 1)}" for v, n in rare)
    return (f"; WARNING: too few rows to learn or measure class{'es' * (len(rare) > 1)} {named} (a model memorises "
            "them, and the eval split may hold none): merge them into another class or leave their rows out")


def _positive_value(values: Counter) -> tuple[str, str]:
    for value in sorted(values):
        if value.strip().lower() in POSITIVE_WORDS:
            return value, "it reads as the positive answer"
    rare = min(values.items(), key=lambda item: (item[1], item[0]))[0]
    return rare, "the rarer value; set label.positive_value to the other one to flip it"


def _long_tail(stats: statistics_pb2.FeatureNameStatistics) -> str:
    """Why a number's distribution has a long tail (empty when it has none), from TFDV's deciles."""
    deciles = next((h for h in stats.num_stats.histograms if h.type == statistics_pb2.Histogram.QUANTILES), None)
    if deciles is None or len(deciles.buckets) < 3:
        return ""
    q10, q90 = deciles.buckets[0].high_value, deciles.buckets[-2].high_value
    low, high = stats.num_stats.min, stats.num_stats.max
    spread = q90 - q10
    if spread <= 0 or max(high - q90, q10 - low) <= LONG_TAIL_RATIO * spread:
        return ""
    far = high if high - q90 >= q10 - low else low
    return f"long tail: {far:g} lies far outside the 10-90% range {q10:g} to {q90:g}"


def _read_date(match: re.Match, order: str) -> tuple[datetime.date, int | None] | None:
    """The date and hour a matched cell holds, None when no such date or hour exists."""
    a, b, c = (int(match.group(k)) for k in "abc")
    year, month, day = {"ymd": (a, b, c), "mdy": (c, a, b), "dmy": (c, b, a)}[order]
    hour = int(match.group("H")) if match.group("H") else None
    try:
        return (datetime.date(year, month, day), hour) if hour is None or hour <= 23 else None
    except ValueError:
        return None


def datetime_format(column: str, values: Counter, schema_type: int) -> tuple[str, str] | None:
    """The format of a date or timestamp column (for data.datetime_features) and why, or None when it is not one."""
    cells = sum(values.values())

    def derived(hour: bool) -> str:
        return f"the Transform graph derives the year, month{', day of week and hour' if hour else ' and day of week'}"

    if schema_type == schema_pb2.INT:
        numbers = [int(v) for v in values]
        if not EPOCH_NAME.search(column) or not all(EPOCH_RANGE[0] <= n < EPOCH_RANGE[1] for n in numbers):
            return None
        first = datetime.datetime.fromtimestamp(min(numbers), datetime.timezone.utc)
        last = datetime.datetime.fromtimestamp(max(numbers), datetime.timezone.utc)
        return EPOCH_FORMAT, (f"seconds since 1970 from {min(numbers)} ({first:%Y-%m-%d %H:%M} UTC) to {max(numbers)} "
                              f"({last:%Y-%m-%d %H:%M} UTC): {derived(True)} (UTC)")
    if schema_type != schema_pb2.BYTES or not cells:
        return None
    for pattern, order, separator in DATE_LAYOUTS:
        regex = re.compile(pattern + TIME_PATTERN)
        matches = {value: regex.fullmatch(value.strip()) for value in values}
        matched = {value: m for value, m in matches.items() if m}
        if sum(values[v] for v in matched) < MIN_DATE_SHARE * cells:
            continue
        note = ""
        if order == "?y":
            firsts, seconds = ([int(m.group(k)) for m in matched.values()] for k in "ab")
            if max(firsts) > 12 and max(seconds) > 12:
                continue
            order = "dmy" if max(firsts) > 12 else "mdy"
            if max(firsts) <= 12 and max(seconds) <= 12:
                note = ("; no field above 12 tells month and day apart: read month first (write "
                        f"%d{separator}%m{separator}%Y if the day comes first)")
        readings = {value: _read_date(m, order) for value, m in matched.items()}
        dates = sum(values[v] for v, r in readings.items() if r)
        if dates < MIN_DATE_SHARE * cells:
            continue
        fields = {"ymd": ("%Y", "%m", "%d"), "mdy": ("%m", "%d", "%Y"), "dmy": ("%d", "%m", "%Y")}[order]
        fmt = separator.join(fields)
        timed = [m for v, m in matched.items() if readings[v] and m.group("H")]
        if timed:
            time_separator = Counter(m.group("sep") for m in timed).most_common(1)[0][0]
            fmt += time_separator + "%H:%M" + (":%S" if any(m.group("S") for m in timed) else "")
        sample = max((v for v in readings if readings[v]), key=lambda v: values[v])
        unread = cells - dates
        rest = (f"; {_cells(unread)} {'hold no date and are' if unread > 1 else 'holds no date and is'} read as "
                "missing" if unread else "")
        return fmt, f"dates such as {sample.strip()!r}: {derived(bool(timed))}{note}{rest}"
    return None


def place_features(header: list[str], label: str, profiles: dict[str, ColumnProfile], markers: list[str],
                   types: dict[str, int], train: statistics_pb2.DatasetFeatureStatistics) -> list[Placement]:
    """Each column but the label: numeric, bucketized, vocabulary or left out, with the reason."""
    stats = {f.path.step[0]: f for f in train.features}
    placements = []
    for column in header:
        if column == label:
            continue
        profile = profiles[column]
        values = _values(profile, markers)
        schema_type = types.get(column, schema_pb2.TYPE_UNKNOWN)
        if not values or schema_type not in SCHEMA_TYPES:
            placements.append(Placement(column, None, "no value in any row"))
            continue
        if len(values) == 1:
            placements.append(Placement(column, None, f"one value only ({next(iter(values))!r}): it cannot tell "
                                                      "rows apart"))
            continue
        missing = _missing(profile, markers)
        present = profile.rows - missing
        gaps = f", {_percent(missing / profile.rows)} missing" if missing else ""
        if missing >= MOSTLY_MISSING_SHARE * profile.rows:
            gaps += " (WARNING: so many gaps leave it little to tell; consider leaving it out)"
        described = f"{SCHEMA_TYPES[schema_type]}, {_distinct(profile, values)} distinct values{gaps}"
        recognised = datetime_format(column, values, schema_type)
        if recognised:
            placements.append(Placement(column, "datetime", f"{described}; {recognised[1]}", recognised[0]))
            continue
        if schema_type == schema_pb2.BYTES:
            if len(values) > IDENTIFIER_MIN_VALUES and (profile.more_values or len(values) > present / 2):
                placements.append(Placement(column, None, f"{described} in {present:,} rows: an identifier or free "
                                                          "text, which a vocabulary cannot generalise from"))
            else:
                placements.append(Placement(column, "vocab", described))
            continue
        why = integer_identifier(column, values, present, profile.more_values) if schema_type == schema_pb2.INT else ""
        if why:
            placements.append(Placement(column, None, f"{described} in {present:,} rows, {why}: an identifier, "
                                                      "which as a number lets the model memorise rows"))
            continue
        if schema_type == schema_pb2.INT and not profile.more_values and len(values) <= VOCAB_MAX_INTEGER_VALUES:
            codes = [int(value) for value in values]
            if min(codes) >= 0 and max(codes) < 2 * len(codes):
                placements.append(Placement(column, "category", f"{described}, 0 to {max(codes)}: codes used as "
                                                                "ids"))
            else:
                placements.append(Placement(column, "vocab", f"{described}, at most {VOCAB_MAX_INTEGER_VALUES}: "
                                                             "codes rather than quantities"))
            continue
        tail = _long_tail(stats[column]) if column in stats else ""
        placements.append(Placement(column, "bucket", f"{described}; {tail}") if tail
                          else Placement(column, "numeric", described))
    return placements


def integer_identifier(column: str, values: Counter, present: int, more_values: bool) -> str:
    """Why an integer column is an identifier (IDENTIFIER_NAME), or "" when it is not: every row a different value,
    evenly spaced or in a column named like a key (past the distinct values a profile counts, the name decides)."""
    named = bool(IDENTIFIER_NAME.search(column))
    if more_values:
        return "more distinct values than init counts, named like a key" if named else ""
    if len(values) <= IDENTIFIER_MIN_VALUES or len(values) < present:
        return ""
    if named:
        return "each a different value, named like a key"
    steps = {b - a for a, b in itertools.pairwise(sorted(int(v) for v in values))}
    return f"each a different value, evenly spaced by {steps.pop()}" if len(steps) == 1 else ""


def finish_schema(schema: schema_pb2.Schema, label: str, open_columns: list[str] | None = None) -> schema_pb2.Schema:
    """SchemaGen's schema with the environments of the curated taxi schema: the label is absent when serving. The
    `open_columns` keep no closed list of values: a date column (tomorrow's dates are not anomalies) and a column the
    config leaves out (a new value there changes nothing the model sees, so it must not stop a run)."""
    finished = schema_pb2.Schema()
    finished.CopyFrom(schema)
    for feature in finished.feature:
        if feature.name not in (open_columns or []):
            continue
        if feature.HasField("domain"):
            kept = [d for d in finished.string_domain if d.name != feature.domain]
            del finished.string_domain[:]
            finished.string_domain.extend(kept)
        feature.ClearField("domain")
        feature.ClearField("string_domain")
    for environment in ("TRAINING", "SERVING"):
        if environment not in finished.default_environment:
            finished.default_environment.append(environment)
    for feature in finished.feature:
        if feature.name == label and "SERVING" not in feature.not_in_environment:
            feature.not_in_environment.append("SERVING")
        elif feature.name != label:
            # Without a shape a feature is optional in the model's signature: a request's gap is filled as Transform
            # fills a training gap, where a required one would read the client's missing value (-1) as a value.
            feature.ClearField("shape")
    return finished


def schema_text(schema: schema_pb2.Schema, data_dir: Path, command: str) -> str:
    """The schema as a text proto, headed by what to review in it."""
    header = [f"# Written by `{command}`: SchemaGen's schema of {data_dir}, as the pipeline's ExampleGen reads it",
              "# (data.missing_values as empty cells). The data-validation gate checks every run against it. Review:",
              "# - type: INT, FLOAT or BYTES (a string) per column;",
              "# - presence: min_fraction 1.0 means every row has the column (an empty cell counts as present);",
              "#   only the label has a shape (a value in every row); a feature has none: a request may lack it, and",
              "#   the model fills that gap as Transform filled the training ones;",
              "# - string_domain: a closed list of values; a value outside it is an anomaly (delete the domain and",
              "#   the feature's `domain:` line to allow any value);",
              "# - the label column is absent in the SERVING environment: requests do not carry it."]
    return "\n".join(header) + "\n" + text_format.MessageToString(schema)


def schema_anomalies(statistics: dict[str, statistics_pb2.DatasetFeatureStatisticsList],
                     schema: schema_pb2.Schema) -> list[str]:
    """What ExampleValidator (TFDV's validate_statistics) would report for each split: nothing for a schema made from
    that data."""
    import tensorflow_data_validation as tfdv

    found = []
    for split, stats in statistics.items():
        anomalies = tfdv.validate_statistics(stats, schema)
        for feature, info in sorted(anomalies.anomaly_info.items()):
            found.append(f"[{split}] {feature}: {info.description or info.short_description}")
    return found


def blessing_bound(kind: str, label_stats: statistics_pb2.FeatureNameStatistics | None,
                   classes: Counter | None = None) -> tuple[dict[str, Any], str]:
    """The evaluation keys a first model must meet to be blessed (and published), with the reason: a classifier's
    AUC bound, and evaluation.no_skill, what ignoring the features scores, from the label's `classes` (value -> rows)
    or, for a regression, its standard deviation in the training split (the mean's RMSE)."""
    margin = EvaluationConfig().no_skill_margin
    if kind != "regression":
        metric = "AUC" if kind == "binary" else "macro AUC (one-vs-rest)"
        bounds: dict[str, Any] = {"lower_bound": MIN_AUC}
        reason = f"blessed with an eval {metric} of at least {MIN_AUC} (0.5 is guessing)"
        if not classes:
            return bounds, reason
        total = sum(classes.values())
        shares = [rows / total for rows in classes.values()]
        no_skill = {"log_loss": round(-sum(share * math.log(share) for share in shares), 4)}
        said = [f"a log loss of at most {no_skill_bound(kind, 'log_loss', no_skill['log_loss'], margin):.4f} (the "
                f"class shares score {no_skill['log_loss']:g})"]
        if kind == "multiclass":
            common, rows = classes.most_common(1)[0]
            no_skill = {"accuracy": round(rows / total, 4), **no_skill}
            bound = no_skill_bound(kind, "accuracy", no_skill["accuracy"], margin)
            said.insert(0, f"an accuracy of at least {bound:.4f} (always answering {common!r} scores "
                           f"{no_skill['accuracy']:g})")
        bounds["no_skill"] = no_skill
        return bounds, (reason + f", {' and '.join(said)}: evaluation.no_skill_margin {margin:g} of the way from "
                        "what ignoring the features scores to a perfect score")
    std = label_stats.num_stats.std_dev if label_stats is not None else 0.0
    figure = float(f"{std:.4g}")
    return {"no_skill": {"rmse": figure}}, (
        f"blessed with an eval RMSE of at most {no_skill_bound(kind, 'rmse', figure, margin):.4g}: "
        f"evaluation.no_skill_margin {margin:g} below {figure:g}, the label's standard deviation in the training "
        "split, which predicting its mean for every row scores")


def regression_tolerances(kind: str, label_stats: statistics_pb2.FeatureNameStatistics | None
                          ) -> tuple[dict[str, dict[str, float]], str]:
    """A regression's tolerances in the label's units (REGRESSION_TOLERANCE_SHARE of its standard deviation), by
    config section, with the reason; none for a classifier, whose defaults are in the metric's own units."""
    std = label_stats.num_stats.std_dev if label_stats is not None else 0.0
    if kind != "regression" or std <= 0:
        return {}, ""
    tolerance = float(f"{REGRESSION_TOLERANCE_SHARE * std:.3g}")
    sections = {key.split(".")[0]: {key.split(".")[1]: tolerance} for key in TOLERANCE_KEYS}
    return sections, (f"{', '.join(TOLERANCE_KEYS)} {tolerance:g}: {REGRESSION_TOLERANCE_SHARE:.1%} of the label's "
                      f"standard deviation {std:.4g}, as the error they limit is in the label's units")


def calibration_buckets(kind: str) -> int:
    """data.calibration_buckets of a starter config: a classifier's probabilities are calibrated on their own split."""
    return 0 if kind == "regression" else 1


def _scalar(value: Any) -> str:
    """A YAML scalar as written in a flow list: quoted where YAML would read it otherwise (?, -, null)."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]


def config_text(name: str, data_dir: Path, markers: list[str], marker_notes: list[str], label_column: str,
                label_name: str, label: LabelChoice, placements: list[Placement], schema_file: str,
                command: str, bound: tuple[dict[str, float], str] = ({}, ""),
                tolerances: tuple[dict[str, dict[str, float]], str] = ({}, ""),
                kinds: dict[str, str] | None = None) -> str:
    """The starter config as YAML, each choice with its reason as a comment; `kinds` (feature -> categorical or
    numeric, as `mlops monitor` compares it) adds the monitoring section."""
    lines = [f"# Written by `{command}`: a starting point to review.",
             f"# The schema ({schema_file}) and this file came from the data; {name}_statistics.html shows it.",
             "# Any key of pipeline/configs/taxi.yaml can be added; the others keep their defaults.",
             f"name: {_scalar(name)}", f"model_name: {_scalar(name)}", "output_root: outputs",
             f"schema_path: {_scalar(schema_file)}   # relative paths are looked up beside this file", "",
             "data:", f"  path: {_scalar(str(data_dir))}"]
    if marker_notes:
        lines += ["  # Read as missing besides the empty cell (in every column):"]
        lines += [f"  #   {note}" for note in marker_notes]
    lines.append(f"  missing_values: [{', '.join(_scalar(m) for m in markers)}]")
    width = max((len(_scalar(p.column)) for p in placements), default=0)
    for group in ("numeric", "bucket", "vocab", "category"):
        chosen = [p for p in placements if p.group == group]
        if not chosen:
            lines.append(f"  {group}_features: []")
            continue
        lines.append(f"  {group}_features:")
        lines += [f"    - {_scalar(p.column):<{width}}  # {p.reason}" for p in chosen]
    dates = [p for p in placements if p.group == "datetime"]
    if dates:
        lines.append("  datetime_features:   # column: format; serving takes the text as it is in the CSV")
        lines += [f"    {_scalar(p.column)}: {_scalar(p.format)}   # {p.reason}" for p in dates]
    left_out = [p for p in placements if p.group is None]
    if left_out:
        lines.append("  # Left out:")
        lines += [f"  #   {p.column}: {p.reason}" for p in left_out]
    if calibration_buckets(label.kind):
        lines.append(f"  calibration_buckets: {calibration_buckets(label.kind)}   # a sixth of the rows, held out of "
                     "training and evaluation: the probabilities are calibrated on them")
    lines += ["", "label:", f"  # {label_column}: {label.reason}"]
    if label_name != "label":
        lines.append(f"  name: {_scalar(label_name)}   # 'label' is a column of the data")
    lines += [f"  column: {_scalar(label_column)}", f"  kind: {label.kind}"]
    lines += [f"  {key}: {_scalar(value)}" for key, value in label.keys.items()]
    bounds, reason = bound
    limits, why = tolerances
    if bounds or limits.get("evaluation"):
        lines += ["", "evaluation:"]
        if bounds:
            lines.append(f"  # {reason}")
            lines += [f"  {key}: {_scalar(value)}" + ("   # what a model that ignores the features scores"
                                                      if key == "no_skill" else "") for key, value in bounds.items()]
            if "no_skill" in bounds:
                lines.append(f"  no_skill_margin: {_scalar(EvaluationConfig().no_skill_margin)}   # the share of the "
                             "gap from those figures to a perfect score the model must close")
        lines += [f"  {key}: {_scalar(value)}   # the most above the baseline model's, in the label's units"
                  for key, value in limits.get("evaluation", {}).items()]
    comments = {"optimize": "pruning may worsen the eval metric by at most this, in the label's units",
                "export": "a quantized TFLite variant may worsen it by at most this"}
    for section in ("optimize", "export"):
        if limits.get(section):
            lines += ["", f"{section}:"] + ([f"  # {why}"] if section == "optimize" else [])
            lines += [f"  {key}: {_scalar(value)}   # {comments[section]}" for key, value in limits[section].items()]
    if kinds:
        lines += monitoring_lines([p.column for p in placements if p.group], kinds,
                                  {p.column for p in placements if p.group == "datetime"})
    return "\n".join(lines) + "\n"


def monitoring_lines(features: list[str], kinds: dict[str, str], dates: set[str] = frozenset()) -> list[str]:
    """The monitoring section of a starter config: the default thresholds, and each chosen feature's own at its
    kind's default, to raise one by one where a feature's traffic differs by design; a date's at 1, the largest
    distance, since served dates come after the training ones by design."""
    defaults = MonitoringConfig()
    lines = ["", "monitoring:                      # mlops monitor: served requests against the training data",
             "  # Skew (against training) and drift (against the window before): the L-infinity distance of a",
             "  # categorical feature's value shares, the Jensen-Shannon divergence of a numeric one's quantile "
             "histograms."]
    lines += [f"  {key}: {_scalar(getattr(defaults, key))}" for key in MONITORING_THRESHOLDS]
    lines.append("  features:")
    width = max((len(_scalar(name)) for name in features), default=0)
    for name in features:
        kind = kinds.get(name, "numeric")
        skew, drift = getattr(defaults, f"{kind}_skew"), getattr(defaults, f"{kind}_drift")
        note = kind
        if name in dates:
            skew, drift, note = 1.0, 1.0, f"{kind}; a date: never flagged by a distance"
        lines.append(f"    {_scalar(name) + ':':<{width + 1}} {{skew: {_scalar(skew)}, drift: {_scalar(drift)}}}   "
                     f"# {note}")
    return lines


def _name_from(folder: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", folder.resolve().name).strip("_-")
    return name or "my_data"


def _read_outputs(config: PipelineConfig) -> tuple[dict[str, statistics_pb2.DatasetFeatureStatisticsList],
                                                   schema_pb2.Schema]:
    from components import artifacts
    from pipeline import metadata

    store = metadata.connect(os.path.abspath(config.metadata_path))
    statistics = {}
    for split in SPLITS + ((artifacts.CALIBRATION_SPLIT,) if config.data.calibration_buckets else ()):
        folder = metadata.latest_split(store, config.name, "StatisticsGen", "statistics", split)
        statistics[split] = statistics_pb2.DatasetFeatureStatisticsList.FromString(
            artifacts.read_bytes(artifacts.join(folder, artifacts.STATISTICS_FILE)))
    schema_uri = metadata.latest_outputs(store, config.name, "SchemaGen")["schema"].uri
    schema = text_format.Parse(artifacts.read_text(artifacts.join(schema_uri, artifacts.SCHEMA_FILE)),
                               schema_pb2.Schema())
    return statistics, schema


def run_statistics(config: PipelineConfig, out: TextIO) -> tuple[dict[str, statistics_pb2.DatasetFeatureStatisticsList],
                                                                 schema_pb2.Schema]:
    """ExampleGen, StatisticsGen and SchemaGen on `config`'s data (its split and markers), below its output_root;
    the statistics of each split and the inferred schema."""
    from pipeline.local.progress import StageProgress
    from pipeline.runner import PipelineError, _logs_to_file

    log_path = os.path.join(config.output_root, "init.log")
    progress = None
    try:
        # Importing TFX and TensorFlow logs Python warnings and C++ lines: here they land in the log.
        with _logs_to_file(log_path):
            from tfx.orchestration.local.local_dag_runner import LocalDagRunner

            from pipeline.pipeline import EXAMPLE_GEN_NODE

            pipeline = _statistics_pipeline(config)
            progress = StageProgress([EXAMPLE_GEN_NODE, "StatisticsGen", "SchemaGen"], out,
                                     os.path.abspath(config.metadata_path), config.name)
            with progress.track():
                LocalDagRunner().run(pipeline)
    except Exception as error:
        if progress is not None:
            progress.failed()
        stage = progress.current if progress is not None else None
        raise PipelineError(f"{stage or 'reading the data'} failed: {error}; see the log at {log_path}") from error
    return _read_outputs(config)


def _statistics_pipeline(config: PipelineConfig) -> Any:
    # Not `tfx.v1`, which imports cloud clients (pipeline/pipeline.py).
    from tfx.components import SchemaGen, StatisticsGen
    from tfx.orchestration.metadata import sqlite_metadata_connection_config
    from tfx.orchestration.pipeline import Pipeline

    from pipeline.pipeline import beam_args, csv_example_gen

    example_gen = csv_example_gen(config)
    statistics_gen = StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = SchemaGen(statistics=statistics_gen.outputs["statistics"], infer_feature_shape=True)
    return Pipeline(
        pipeline_name=config.name,
        pipeline_root=os.path.abspath(config.pipeline_root),
        components=[example_gen, statistics_gen, schema_gen],
        enable_cache=False,
        metadata_connection_config=sqlite_metadata_connection_config(os.path.abspath(config.metadata_path)),
        beam_pipeline_args=beam_args(config),
    )


def init_project(data: str, label: str, output: str = ".", name: str = "", force: bool = False,
                 out: TextIO | None = None, command: str = "") -> InitResult:
    """Reads the CSV folder `data` as the pipeline will, and writes <name>.yaml, <name>_schema.pbtxt and
    <name>_statistics.html to `output`. Raises DataError (exit code 2) for anything the user can fix."""
    out = out or sys.stdout
    folder = Path(data)
    if folder.is_file():
        raise DataError(f"--data {folder} is a file; pass the folder that holds the CSV files ({folder.parent}).")
    files = check_csv_folder(folder)
    read_header = read_csv_header(files[0])
    header = list(read_header.names)
    # The label may be given by the header's own name or by the feature's.
    label = dict(zip(read_header.columns, read_header.names, strict=True)).get(label, label)
    if label not in header:
        raise DataError(f"--label {label!r} is not a column of the CSV files in {folder}; choose one of "
                        f"{', '.join(header)}.")
    name = name or _name_from(folder)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        raise DataError(f"--name {name!r} must be letters, digits, '_' and '-' (it names files and the model).")
    target = Path(output)
    paths = [target / f"{name}.yaml", target / f"{name}_schema.pbtxt", target / f"{name}_statistics.html"]
    if target.exists() and not target.is_dir():
        raise DataError(f"--output {target} is a file; pass a folder.")
    existing = [str(p) for p in paths if p.exists()]
    if existing and not force:
        raise DataError(f"{', '.join(existing)} already exist{'s' * (len(existing) == 1)}; pass --force to replace "
                        "them, or --output another folder.")

    profiles = profile_columns(files, COMMON_MISSING_MARKERS)
    rows = next(iter(profiles.values())).rows
    print(f"reading {len(files)} CSV file(s) from {folder.resolve()}: {rows:,} rows, {len(header)} columns", file=out)
    if read_header.row_index:
        print("  the header's first column has no name: read as a row index (as R and pandas write one) and left out",
              file=out)
    for column, feature in read_header.renamed():
        print(f"  column {column!r} is the feature {feature!r} in the config, the model and its requests (every "
              "export format takes lower-case letters, digits and _; the project's clients and `mlops predict` take "
              f"{column!r} too)", file=out)
    markers, marker_notes = propose_markers(profiles)
    for note in marker_notes:
        print(f"  missing-value marker {note}", file=out)
    junk, junk_notes = propose_junk_markers(profiles)
    for note in junk_notes:
        print(f"  {note}", file=out)
    read_as_markers(profiles, junk)
    sentinels, sentinel_notes = propose_sentinel_markers(profiles)
    for note in sentinel_notes:
        print(f"  {note}", file=out)
    read_as_markers(profiles, sentinels)
    markers, marker_notes = markers + junk + sentinels, marker_notes + junk_notes + sentinel_notes
    print(f"  data.missing_values: [{', '.join(_scalar(m) for m in markers)}]", file=out, flush=True)
    check_number_formats(profiles, markers)

    # The task as the profile types the label (ExampleGen's own inference): init splits the rows as the run of its
    # config will, so the counts it prints are the run's, and a label with nothing to predict fails before TFX.
    guess = infer_label(profiles[label], PROFILE_TYPES.get(profiles[label].kind, schema_pb2.TYPE_UNKNOWN), markers)

    work = Path(tempfile.mkdtemp(prefix="mlops-init-"))
    config = PipelineConfig(name=name, output_root=str(work),
                            data=DataConfig(path=str(folder.resolve()), missing_values=markers,
                                            calibration_buckets=calibration_buckets(guess.kind)),
                            # ExampleGen leaves out the rows without a label, as the run will: the schema then
                            # requires the label, and the statistics are those of the rows the model learns from.
                            label=LabelConfig(column=label, kind=guess.kind, **guess.keys),
                            beam=BeamConfig(direct_running_mode="in_memory"))
    statistics, inferred = run_statistics(config, out)
    try:
        result = _choose_and_write(name, folder, label, header, profiles, markers, marker_notes, statistics, inferred,
                                   paths, work, command or f"mlops init --data {data} --label {label}", out)
    except DataError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    width = max(len(str(p)) for p in paths)
    print("wrote", file=out)
    for path, what in zip(paths, ("the config", "the schema the data-validation gate checks",
                                  "the statistics of every column, per split"), strict=True):
        print(f"  {str(path):<{width}}  {what}", file=out)
    print(f"review these two files, then `mlops run --config {paths[0]}`", file=out, flush=True)
    return result


def _choose_and_write(name: str, folder: Path, label: str, header: list[str], profiles: dict[str, ColumnProfile],
                      markers: list[str], marker_notes: list[str],
                      statistics: dict[str, statistics_pb2.DatasetFeatureStatisticsList], inferred: schema_pb2.Schema,
                      paths: list[Path], work: Path, command: str, out: TextIO) -> InitResult:
    types = {feature.name: feature.type for feature in inferred.feature}
    choice = infer_label(profiles[label], types.get(label, schema_pb2.TYPE_UNKNOWN), markers)
    print(f"label {label}: {choice.reason}", file=out)
    placements = place_features(header, label, profiles, markers, types, statistics["train"].datasets[0])
    if not any(p.group for p in placements):
        raise DataError(f"no column besides '{label}' can be a feature: "
                        + "; ".join(f"{p.column}: {p.reason}" for p in placements) + ".")
    print("features:", file=out)
    width = max(len(p.column) for p in placements)
    groups = {"numeric": "numeric", "bucket": "bucketized", "vocab": "vocabulary", "category": "category",
              "datetime": "date", None: "left out"}
    for placement in placements:
        print(f"  {groups[placement.group]:<10}  {placement.column:<{width}}  {placement.reason}", file=out)

    schema = finish_schema(inferred, label, [p.column for p in placements if p.group in ("datetime", None)])
    anomalies = schema_anomalies(statistics, schema)
    if anomalies:
        raise RuntimeError("the schema mlops init made does not accept the data it came from: "
                           + "; ".join(anomalies) + f" (the work folder {work} holds the statistics)")
    counts = ", ".join(f"{split} {stats.datasets[0].num_examples:,} rows" for split, stats in statistics.items())
    print(f"the schema accepts the data it came from ({counts}): no anomalies", file=out)

    label_stats = next((f for f in statistics["train"].datasets[0].features
                        if (f.path.step[-1] if f.path.step else f.name) == label), None)
    bound = blessing_bound(choice.kind, label_stats, _values(profiles[label], markers))
    print(f"evaluation: {bound[1]}", file=out)
    tolerances = regression_tolerances(choice.kind, label_stats)
    if tolerances[0]:
        print(f"tolerances: {tolerances[1]}", file=out)
    label_name = next(n for n in ("label", "target", f"{label}_label") if n not in header)
    # How `mlops monitor` will compare each feature: by the type the schema gives it.
    kinds = {feature.name: feature_kind(feature) for feature in schema.feature}
    config = config_text(name, folder.resolve(), markers, marker_notes, label, label_name, choice, placements,
                         paths[1].name, command, bound, tolerances, kinds)
    notes = [f"Missing-value markers read as empty cells: {', '.join(repr(m) for m in markers) or 'none'}."]
    page = statistics_html(statistics, f"Statistics of {folder.resolve()}", notes)
    texts = [config, schema_text(schema, folder.resolve(), command), page]
    # The config must load (beside its schema) before anything is written where the user asked.
    for path, text in zip(paths, texts, strict=True):
        (work / path.name).write_text(text)
    try:
        load_config(work / paths[0].name)
    except ConfigError as e:
        raise RuntimeError(f"mlops init made a config that does not load ({e}); see {work}.") from e
    _write_all(paths, texts)
    return InitResult(paths[0], paths[1], paths[2], markers, choice, placements)


def _write_all(paths: list[Path], texts: list[str]) -> None:
    """Writes every file or none: each goes to a temporary name first, then all are renamed."""
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        for path, text in zip(paths, texts, strict=True):
            temporary = path.with_name(f".{path.name}.tmp")
            temporary.write_text(text)
            staged.append(temporary)
    except OSError as e:
        for temporary in staged:
            temporary.unlink(missing_ok=True)
        raise DataError(f"cannot write to {paths[0].parent}: {e.strerror}; pass --output a folder you can write.") \
            from e
    for temporary, path in zip(staged, paths, strict=True):
        os.replace(temporary, path)
