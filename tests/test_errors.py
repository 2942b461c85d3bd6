"""The error root (settings/errors.py): an error a user can fix is reported once, by the command line, as its
prefix and message on stderr and its exit status; any other exception is a bug and keeps its traceback."""
import argparse

import pytest

from components.distributed.launcher import WorkerFailedError
from components.distributed.tfjob import TFJobFailedError
from components.gates.anomalies import DataValidationError
from monitoring.logs import LogError
from monitoring.monitor import MonitorError
from pipeline.data import DataError
from pipeline.kubeflow import KubeflowError
from pipeline.runner import PipelineError
from pipeline.training import NoTransformOutputError
from rollout.backends import BackendError
from rollout.controller import RolloutError
from rollout.state import ControllerBusyError, StateConflictError
from rollout.verify import GoldenDataError
from serving.repository.base import RepositoryError
from serving.server.model_manager import ModelConfigError
from settings.arguments import run_command
from settings.config import ConfigError
from settings.errors import UserError

# What each command printed and returned for these errors before they shared a root.
REPORTED = [(ConfigError, "config error", 2), (DataError, "error", 2),
            (DataValidationError, "stopped by the data-validation gate", 3), (PipelineError, "error", 1),
            (NoTransformOutputError, "error", 2), (WorkerFailedError, "training failed", 1),
            (TFJobFailedError, "training failed", 1), (KubeflowError, "error", 2), (RolloutError, "error", 2),
            (BackendError, "error", 2), (GoldenDataError, "error", 2), (StateConflictError, "error", 2),
            (ControllerBusyError, "error", 2), (LogError, "error", 2), (MonitorError, "error", 2),
            (RepositoryError, "error", 2), (ModelConfigError, "error", 2)]


def made(kind: type[UserError], message: str) -> UserError:
    if kind is DataValidationError:
        error = DataValidationError([], "/runs/anomalies")
        error.args = (message,)
        return error
    return kind(message)


def raising(error: BaseException) -> argparse.Namespace:
    def handler(args: argparse.Namespace) -> int:
        raise error

    return argparse.Namespace(handler=handler)


@pytest.mark.parametrize(("kind", "prefix", "code"), REPORTED, ids=[kind.__name__ for kind, _, _ in REPORTED])
def test_each_error_is_printed_once_with_its_prefix_and_status(kind, prefix, code, capsys):
    assert issubclass(kind, UserError)
    assert run_command(raising(made(kind, "the data folder is empty; point data.path at CSV files."))) == code
    captured = capsys.readouterr()
    assert captured.err == f"{prefix}: the data folder is empty; point data.path at CSV files.\n"
    assert captured.out == ""


def test_an_error_no_user_can_fix_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        run_command(raising(ZeroDivisionError("a bug")))


def test_a_command_that_succeeds_returns_its_own_status():
    assert run_command(argparse.Namespace(handler=lambda args: 4)) == 4
