"""Errors a user can fix (bad names, missing files, bad hyperparameters): the CLI prints them in one line."""


class ForesightError(Exception):
    """Base class of user-facing errors."""
