"""Names shared by the Transform and Trainer module code: which features exist and how they are called."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components.specs import DATA_KEY, LABEL_KEY, TRANSFORM_KEY
from settings.config import (
    DATETIME_ID_PARTS,
    DataConfig,
    LabelConfig,
    TransformConfig,
    datetime_fields,
    datetime_parts,
    read_section,
)


def transformed_name(key: str) -> str:
    return f"{key}_xf"


@dataclass(frozen=True)
class FeatureLayout:
    """The feature groups, the label and the Transform settings of a run: the config's data, label and transform
    sections, as every component receives them."""

    data: DataConfig
    label: LabelConfig
    transform: TransformConfig

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any]) -> FeatureLayout:
        """From a component's custom_config or properties (see components/specs.py)."""
        return cls(read_section(properties, DATA_KEY, DataConfig), read_section(properties, LABEL_KEY, LabelConfig),
                   read_section(properties, TRANSFORM_KEY, TransformConfig))

    @property
    def numeric(self) -> list[str]:
        return list(self.data.numeric_features)

    @property
    def bucket(self) -> list[str]:
        return list(self.data.bucket_features)

    @property
    def vocab(self) -> list[str]:
        return list(self.data.vocab_features)

    @property
    def category(self) -> list[str]:
        return list(self.data.category_features)

    @property
    def datetime(self) -> dict[str, str]:
        """Date and timestamp columns and their formats."""
        return dict(self.data.datetime_features)

    def datetime_parts(self, column: str) -> list[str]:
        """The features derived from a date or timestamp column: year, month, day_of_week (and hour)."""
        return datetime_parts(datetime_fields(self.data.datetime_features[column]))

    @property
    def model_numeric(self) -> list[str]:
        """Every feature the model takes as a number: the numeric columns and each date's year."""
        return self.numeric + [f"{column}_year" for column in self.datetime]

    def datetime_cardinalities(self) -> dict[str, int]:
        """The ids a date's month, day of week and hour take: one per value, and one more for missing."""
        return {transformed_name(f"{column}_{part}"): DATETIME_ID_PARTS[part] + 1
                for column in self.datetime for part in self.datetime_parts(column) if part in DATETIME_ID_PARTS}

    @property
    def raw_features(self) -> list[str]:
        return self.numeric + self.bucket + self.vocab + self.category + list(self.datetime)

    @property
    def label_key(self) -> str:
        return self.label.name

    @property
    def label_columns(self) -> list[str]:
        """Raw columns the label is computed from that are not features themselves."""
        return [self.label.column]
