"""The root of every error a user can cause and fix: its message says, in one sentence, what happened and what to do.
The command line catches it once (pipeline/cli.py `_main`), prints `<prefix>: <message>` and exits with its status;
nothing below reports it."""
from __future__ import annotations


class UserError(Exception):
    """An error the user can fix. Subclasses set the exit status and the word the command line prints first."""

    exit_code: int = 1
    prefix: str = "error"
