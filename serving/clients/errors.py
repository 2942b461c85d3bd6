"""The exceptions the clients raise, one per canonical status code a caller may handle."""
from __future__ import annotations


class ServingError(Exception):
    """A request TF Serving did not answer successfully; `code` is the canonical status name."""

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


class ModelNotFoundError(ServingError):
    """The model, version or label is not served."""


class InvalidInputError(ServingError):
    """The rows do not fit the model's signature (unknown feature, wrong type, too many rows...)."""


class ServingTimeoutError(ServingError):
    """No answer within the timeout."""


class ServingUnavailableError(ServingError):
    """The server could not be reached or said it is unavailable, after all retries."""


def error_for(code: str, message: str) -> ServingError:
    """The typed exception for a canonical status code and the server's message."""
    if code == "NOT_FOUND" or (code == "INVALID_ARGUMENT" and "version label" in message):
        return ModelNotFoundError(message, code)
    if code == "INVALID_ARGUMENT":
        return InvalidInputError(message, code)
    if code == "DEADLINE_EXCEEDED":
        return ServingTimeoutError(message, code)
    if code == "UNAVAILABLE":
        return ServingUnavailableError(message, code)
    return ServingError(message, code)
