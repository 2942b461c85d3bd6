"""The config checked against the schema and the CSV files before any TFX stage runs: a wrong column name, a numeric
feature the schema types as a string, or a marker the config does not declare would otherwise fail deep inside
Transform or at the data-validation gate. Each problem stops the run with one sentence (DataError) that names the
column, shows sample values where there are some, and says which key or marker to set."""
from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from pipeline.data import DataError, csv_header, profile_columns
from settings.config import EPOCH_FORMAT, PipelineConfig

NUMERIC_TYPES = {schema_pb2.INT: "INT", schema_pb2.FLOAT: "FLOAT"}
TYPE_NAMES = {schema_pb2.TYPE_UNKNOWN: "no type", schema_pb2.BYTES: "BYTES (a string)", schema_pb2.INT: "INT",
              schema_pb2.FLOAT: "FLOAT", schema_pb2.STRUCT: "STRUCT"}


def load_schema(path: str) -> schema_pb2.Schema:
    """The schema text file at `path`; DataError when it is not a schema."""
    try:
        return text_format.Parse(Path(path).read_text(), schema_pb2.Schema())
    except (OSError, text_format.ParseError, UnicodeDecodeError) as e:
        raise DataError(f"schema file {path} is not a readable schema text file ({str(e).splitlines()[0]}); fix it "
                        "or write a new one with `mlops init`.") from e


def check_config(config: PipelineConfig, files: list[Path] | None = None) -> None:
    """Raises DataError for the first mismatch between the config, the schema and, when `files` are given (a local
    folder), the CSV header and the values of the columns the schema types as numbers."""
    schema = load_schema(config.schema_path)
    types = {feature.name: feature.type for feature in schema.feature}
    header = csv_header(files[0]) if files else None
    folder = files[0].parent if files else None
    where = f"the CSV files in {folder}" if folder else "the data"

    def check_column(column: str, key: str) -> None:
        verb = "lists" if key.startswith("data.") else "names"
        if header is not None and column not in header:
            raise DataError(f"{key} {verb} '{column}', which is not a column of {where}; "
                            f"{'fix or remove it' if verb == 'lists' else f'set {key} to one'} (columns: "
                            f"{', '.join(header)}).")
        if column not in types:
            remedy = "remove it from " + key if verb == "lists" else "set " + key + " to a column it describes"
            raise DataError(f"{key} {verb} '{column}', which the schema {config.schema_path} does not describe; add "
                            f"it to the schema (or write a new one with `mlops init`), or {remedy}.")

    label = config.label
    check_column(label.column, "label.column")
    if label.relative_to:
        check_column(label.relative_to, "label.relative_to")
    groups = [("data.numeric_features", config.data.numeric_features),
              ("data.bucket_features", config.data.bucket_features),
              ("data.vocab_features", config.data.vocab_features),
              ("data.category_features", config.data.category_features),
              ("data.datetime_features", list(config.data.datetime_features))]
    for key, names in groups:
        for name in names:
            check_column(name, key)
    if header is not None:
        _check_numeric_cells(config, files, header, types)

    needs_number = [(key, name) for key, names in groups[:2] for name in names]
    if label.kind == "regression" or (label.kind == "binary" and not label.positive_value):
        needs_number.append(("label.column", label.column))
    if label.relative_to:
        needs_number.append(("label.relative_to", label.relative_to))
    for key, name in needs_number:
        if types[name] not in NUMERIC_TYPES:
            raise DataError(_not_a_number(config, key, name, types[name], files))
    for name in config.data.category_features:
        if types[name] != schema_pb2.INT:
            typed = TYPE_NAMES.get(types[name], types[name])
            raise DataError(f"data.category_features lists '{name}', whose values are used as ids, but the schema "
                            f"{config.schema_path} types it as {typed}; move it to data.vocab_features.")
    for name, fmt in config.data.datetime_features.items():
        needed = schema_pb2.INT if fmt.strip() == EPOCH_FORMAT else schema_pb2.BYTES
        if types[name] != needed:
            typed = TYPE_NAMES.get(types[name], types[name])
            remedy = ("write the format its text has, such as %Y-%m-%d" if fmt.strip() == EPOCH_FORMAT else
                      f"use {EPOCH_FORMAT} for whole seconds since 1970" if types[name] == schema_pb2.INT else
                      "list it under data.numeric_features")
            raise DataError(f"data.datetime_features reads '{name}' as {fmt!r}, which needs "
                            f"{TYPE_NAMES[needed]} cells, but the schema {config.schema_path} types it as {typed}; "
                            f"{remedy}.")


def _not_a_number(config: PipelineConfig, key: str, name: str, schema_type: int, files: list[Path] | None) -> str:
    """The sentence for a column the config reads as numbers but the schema types otherwise."""
    samples, numbers_too = "", False
    if files:
        profile = profile_columns(files, config.data.missing_values, [name])[name]
        samples = profile.samples(("string",))
        numbers_too = bool(profile.types["int"] or profile.types["float"])
    typed = f"the schema {config.schema_path} types it as {TYPE_NAMES.get(schema_type, schema_type)}"
    values = f", with values such as {samples}" if samples else ""
    if key == "label.column" and config.label.kind == "binary":
        return (f"label.column '{name}' is compared with label.threshold, but {typed}{values}; set "
                "label.positive_value to the value that counts as positive, or label.kind to multiclass for more "
                "than two classes.")
    if key == "label.column":
        return (f"label.kind is regression, which needs a numeric label, but for label.column '{name}' "
                f"{typed}{values}; if some of them mark missing values, add them to data.missing_values and write a "
                "new schema with `mlops init`, else set label.kind to multiclass.")
    remedy = "move it to data.vocab_features" if key != "label.relative_to" else "choose a numeric column"
    if numbers_too:
        remedy = (f"if they mark missing values, add them to data.missing_values and write a new schema with "
                  f"`mlops init`, else {remedy}")
    verb = "names" if key == "label.relative_to" else "lists"
    return f"{key} {verb} '{name}', which must hold numbers, but {typed}{values}; {remedy}."


def _check_numeric_cells(config: PipelineConfig, files: list[Path], header: list[str], types: dict[str, int]) -> None:
    """Every column the schema types as a number must hold numbers of that type, markers aside: ExampleGen would
    otherwise read it as a string and the gate stop the run on a type mismatch."""
    numeric = [name for name in header if types.get(name) in NUMERIC_TYPES]
    if not numeric:
        return
    profiles = profile_columns(files, config.data.missing_values, numeric)
    for name in numeric:
        schema_type = NUMERIC_TYPES[types[name]]
        odd = ("string",) if schema_type == "FLOAT" else ("string", "float")
        samples = profiles[name].samples(odd)
        if samples:
            kind = "numbers" if schema_type == "FLOAT" else "integers"
            raise DataError(
                f"column '{name}' is {schema_type} in the schema {config.schema_path}, but the CSV files in "
                f"{files[0].parent} hold values that are not {kind}: {samples}; if they mark missing values, add "
                f"them to data.missing_values, else correct those cells.")
