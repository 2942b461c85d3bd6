"""The distributed-training keys of the config: defaults that keep one local worker, and checked combinations."""
import os

import pytest

from settings.config import ConfigError, load_config


def test_defaults_are_one_local_worker():
    training = load_config().training
    assert (training.workers, training.backend, training.max_restarts) == (1, "local", 2)
    assert training.tfjob.operator == "kubeflow" and training.tfjob.restart_policy == "ExitCode"


def test_tfjob_mount_path_defaults_to_the_absolute_output_root(tmp_path):
    config = load_config(None, ["training.backend=tfjob", f"output_root={tmp_path}/out"])
    assert config.resolved_training().tfjob.mount_path == os.path.abspath(f"{tmp_path}/out")
    assert config.sections("training")["training"]["tfjob"]["mount_path"] == os.path.abspath(f"{tmp_path}/out")
    local = load_config(None, [f"output_root={tmp_path}/out"])
    assert local.resolved_training().tfjob.mount_path == ""


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["training.workers=0"], "training.workers must be at least 1"),
        (["training.workers=3"], r"training.batch_size \(128\) is the global batch and must be a multiple of "
                                 r"training.workers \(3\)"),
        (["training.max_restarts=-1"], "training.max_restarts must be 0 or more"),
        (["training.backend=slurm"], "'training.backend' must be one of 'local', 'tfjob'"),
        (["training.tfjob.restart_policy=OnFailed"], "'training.tfjob.restart_policy' must be one of"),
        (["training.tfjob.clean_pod_policy=Sometimes"], "'training.tfjob.clean_pod_policy' must be one of"),
        (["training.backend=tfjob", "training.tfjob.image="], "training.tfjob.image is empty"),
        (["training.backend=tfjob", "output_root=/data/out", "training.tfjob.mount_path=/mnt/pvc"],
         "output_root /data/out is not below training.tfjob.mount_path /mnt/pvc"),
        (["training.backend=tfjob", "training.tfjob.model_version_name=taxi"], "is a KubeDL feature"),
        (["training.backend=tfjob", "training.tfjob.operator=kubedl", "training.tfjob.model_version_name=taxi"],
         "a KubeDL ModelVersion needs all of"),
        (["training.tfjob.imag=x"], "unknown config key 'training.tfjob.imag'"),
    ],
)
def test_wrong_distribution_settings_name_the_key(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, overrides)
