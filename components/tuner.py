"""The Tuner component's `tuner_fn`: KerasTuner random or Bayesian search over width, depth and learning rate,
judged by the task's validation figure (AUC, or RMSE for a regression)."""
from __future__ import annotations

import keras_tuner
import tensorflow as tf
import tensorflow_transform as tft
from tfx.components.trainer.fn_args_utils import FnArgs
from tfx.components.tuner.component import TunerFnResult

from components.features import FeatureLayout, transformed_name
from components.model import (
    apply_hyperparameters,
    build_model,
    categorical_cardinalities,
    input_fn,
    training_objective,
)
from components.specs import TRAINING_KEY, TUNER_KEY
from components.tasks import task_from_transform
from settings.config import TrainingConfig, TunerConfig, read_section


def search_space() -> keras_tuner.HyperParameters:
    hp = keras_tuner.HyperParameters()
    hp.Choice("units", [16, 32, 64, 128], default=64)
    hp.Int("depth", 1, 3, default=2)
    hp.Float("learning_rate", 5e-4, 2e-2, sampling="log", default=2e-3)
    return hp


def tuner_fn(fn_args: FnArgs) -> TunerFnResult:
    """TFX Tuner entry point; the best hyperparameters go to the Trainer through `apply_hyperparameters`."""
    layout = FeatureLayout.from_properties(fn_args.custom_config)
    training = read_section(fn_args.custom_config, TRAINING_KEY, TrainingConfig)
    settings = read_section(fn_args.custom_config, TUNER_KEY, TunerConfig)
    tft_output = tft.TFTransformOutput(fn_args.transform_graph_path)
    numeric = [transformed_name(k) for k in layout.model_numeric]
    cardinalities = categorical_cardinalities(layout, tft_output)
    task = task_from_transform(layout.label, tft_output)
    objective, direction = training_objective(task)

    tf.keras.utils.set_random_seed(training.seed)

    def build(hp: keras_tuner.HyperParameters):
        return build_model(numeric, cardinalities, apply_hyperparameters(training, hp.get_config()), task)

    common = dict(
        hypermodel=build,
        hyperparameters=search_space(),
        objective=keras_tuner.Objective(objective, direction),
        max_trials=settings.max_trials,
        directory=fn_args.working_dir,
        project_name="search",
        overwrite=True,
        seed=training.seed,
    )
    if settings.algorithm == "bayesian":
        tuner = keras_tuner.BayesianOptimization(**common)
    else:
        tuner = keras_tuner.RandomSearch(**common)
    batch = training.batch_size
    return TunerFnResult(
        tuner=tuner,
        fit_kwargs={
            "x": input_fn(fn_args.train_files, fn_args.data_accessor, tft_output, layout.label_key, batch),
            "validation_data": input_fn(fn_args.eval_files, fn_args.data_accessor, tft_output, layout.label_key, batch),
            "steps_per_epoch": fn_args.train_steps,
            "validation_steps": fn_args.eval_steps,
            "verbose": 2,
        },
    )
