"""A model no better than ignoring the features is not blessed: `mlops init` writes what the trivial predictor scores
(the class shares' log loss, the most common class's accuracy) into evaluation.no_skill, and a run whose features
carry nothing about the label stops at the Evaluator, with the console naming those keys and the figures."""
import csv
import random
from pathlib import Path

import pytest

from tests.conftest import init_and_run

# No pruning and a wide quantization tolerance: a model of noise can lose more than a tolerance to either, and the
# run would stop in the Optimizer or the Exporter, not at the Evaluator this test is about.
SMALL = ["training.train_steps=300", "training.steps_per_epoch=50", "training.eval_steps=5", "optimize.prune=false",
         "export.max_quantized_degradation=1", "transform.statistics=false", "export.latency_rows=10",
         "beam.direct_running_mode=in_memory"]
SHARES = {"gold": 49, "silver": 20, "bronze": 15, "tin": 10, "lead": 6}


def write_noise(folder: Path, rows: int = 600) -> Path:
    """Five classes on 49, 20, 15, 10 and 6% of the rows, drawn without regard to the three features."""
    rng = random.Random(5)
    folder.mkdir(parents=True, exist_ok=True)
    classes = [name for name, share in SHARES.items() for _ in range(share)]
    with open(folder / "medals.csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["weight", "height", "colour", "medal"])
        for _ in range(rows):
            writer.writerow([f"{rng.uniform(40, 120):.1f}", rng.randint(140, 210),
                             rng.choice(["red", "green", "blue", "white"]), rng.choice(classes)])
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("medals")
    data = write_noise(root / "medals")
    return init_and_run(root, data, "medal", SMALL)


def test_init_writes_the_no_skill_figures_of_the_data(project):
    config, _ = project
    assert config.label.kind == "multiclass"
    assert set(config.evaluation.no_skill) == {"accuracy", "log_loss"}
    assert 0.45 < config.evaluation.no_skill["accuracy"] < 0.53, "gold's share of the rows"
    assert 1.2 < config.evaluation.no_skill["log_loss"] < 1.45, "the five shares' entropy is 1.34"
    assert config.evaluation.no_skill_margin == 0.1


def test_a_model_of_noise_is_not_blessed_and_the_console_names_the_no_skill_keys(project):
    config, summary = project
    assert summary.blessed is False and summary.published_version is None, summary
    no_skill = config.evaluation.no_skill
    accuracy_bound = no_skill["accuracy"] + 0.1 * (1 - no_skill["accuracy"])
    log_loss_bound = 0.9 * no_skill["log_loss"]
    failed_accuracy = summary.metrics["accuracy"] < accuracy_bound
    failed_log_loss = summary.metrics["log_loss"] > log_loss_bound
    assert failed_accuracy or failed_log_loss, summary.metrics
    said = summary.blessing_failure
    if failed_accuracy:
        assert f"evaluation.no_skill.accuracy={no_skill['accuracy']:g} and evaluation.no_skill_margin=0.1" in said
    if failed_log_loss:
        assert f"evaluation.no_skill.log_loss={no_skill['log_loss']:g} and evaluation.no_skill_margin=0.1" in said
    # The figures of ignoring the features on the same eval rows are beside the model's.
    assert {"accuracy", "log_loss"} <= set(summary.export.no_skill), summary.export


def test_a_stage_failing_beside_it_names_the_evaluators_verdict_too(project):
    # A model of noise often fails the Exporter's quantization tolerance too: raising it would be a dead end.
    from pipeline.runner import evaluator_verdict

    config, summary = project
    assert evaluator_verdict(config) == f" (and the Evaluator did not bless this model: {summary.blessing_failure})"
