"""Keys of the components' inputs, outputs and properties, shared by specs, executors, the DAG and the tests, as
TFX's own `standard_component_specs` are for its components.

Configuration crosses the component boundary as typed sections of PipelineConfig: the DAG writes each section a
component reads under the section's name (`PipelineConfig.sections`), and the component reads it back with
`settings.config.read_section`, into the same dataclass.
"""
from tfx.types import standard_component_specs as tfx_specs

from settings.config import SECTION_TYPES


def _section(name: str) -> str:
    """The property carrying the config section `name`, named like it; a name PipelineConfig has no section of fails
    here, when this module is imported, so the keys cannot drift from the dataclasses."""
    if name not in SECTION_TYPES:
        raise KeyError(f"PipelineConfig has no section '{name}'; its sections are {', '.join(SECTION_TYPES)}.")
    return name


# Channels (TFX's names where TFX has one).
EXAMPLES_KEY = tfx_specs.EXAMPLES_KEY
MODEL_KEY = tfx_specs.MODEL_KEY
MODEL_BLESSING_KEY = tfx_specs.MODEL_BLESSING_KEY
TRANSFORM_GRAPH_KEY = tfx_specs.TRANSFORM_GRAPH_KEY
ANOMALIES_KEY = tfx_specs.ANOMALIES_KEY
# TFX wants argument names unique across a component's inputs and outputs, hence not "model".
OPTIMIZED_MODEL_KEY = "optimized_model"
EXPORTED_MODEL_KEY = "exported_model"

# Properties: one per config section, named like the section, plus the module code's fingerprint.
DATA_KEY = _section("data")
LABEL_KEY = _section("label")
TRANSFORM_KEY = _section("transform")
TRAINING_KEY = _section("training")
TUNER_KEY = _section("tuner")
OPTIMIZE_KEY = _section("optimize")
CALIBRATION_KEY = _section("calibration")
EXPORT_KEY = _section("export")
# ExampleGen's custom_config: the cell values read as missing (data.missing_values).
MISSING_VALUES_KEY = "missing_values"
# ... and, with data.stratify, the label section ExampleGen stratifies the split by.
STRATIFY_LABEL_KEY = "stratify_label"
# ... and the label's raw column: rows without a value there are left out (nothing to learn or measure from them).
LABEL_COLUMN_KEY = "label_column"
EVALUATION_KEY = _section("evaluation")
# A hash of the module code (pipeline.pipeline.code_fingerprint): TFX's cache keys on properties, not on source code.
CODE_FINGERPRINT_KEY = "code_fingerprint"

# The sections each piece of module code and each custom component reads.
FEATURE_SECTIONS = (DATA_KEY, LABEL_KEY, TRANSFORM_KEY)
TRAINER_SECTIONS = (*FEATURE_SECTIONS, TRAINING_KEY, TUNER_KEY)
# The Optimizer's and the Exporter's gates watch the metric that blesses the model (evaluation.metric).
OPTIMIZER_SECTIONS = (*FEATURE_SECTIONS, TRAINING_KEY, OPTIMIZE_KEY, EVALUATION_KEY, CALIBRATION_KEY)
EXPORTER_SECTIONS = (*FEATURE_SECTIONS, EXPORT_KEY, EVALUATION_KEY)
