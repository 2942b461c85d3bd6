"""Names shared by the Transform and Trainer module code: which features exist and how they are called."""
from __future__ import annotations

from typing import Any


def transformed_name(key: str) -> str:
    return f"{key}_xf"


class FeatureLayout:
    """The feature groups and label of a run, read from the `custom_config` dict the pipeline passes."""

    def __init__(self, custom_config: dict[str, Any]):
        features = custom_config["features"]
        self.numeric: list[str] = list(features["numeric"])
        self.bucket: list[str] = list(features["bucket"])
        self.vocab: list[str] = list(features["vocab"])
        self.label: dict[str, Any] = dict(custom_config["label"])
        self.transform: dict[str, Any] = dict(custom_config["transform"])

    @property
    def raw_features(self) -> list[str]:
        return self.numeric + self.bucket + self.vocab

    @property
    def label_key(self) -> str:
        return self.label["name"]

    @property
    def label_columns(self) -> list[str]:
        """Raw columns the label is computed from that are not features themselves."""
        return [self.label["column"]]
