"""Errors that reach the user as one line and an exit code."""

from __future__ import annotations


class MemdocError(Exception):
    """An error that the CLI prints as one line (plus an optional hint) and exits with."""

    def __init__(self, message: str, *, exit_code: int = 2, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.hint = hint


class TraceError(MemdocError):
    """A file that is not a memdoc trace, or one of a version this memdoc cannot read."""


class InputError(MemdocError):
    """Input that memdoc cannot use: a missing file, an unreadable log, a hostile pickle."""


class OutputExistsError(MemdocError):
    """An output file exists and --force was not given."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} exists; not overwriting it",
            exit_code=2,
            hint="pass --force to overwrite, or -o to choose another path",
        )
