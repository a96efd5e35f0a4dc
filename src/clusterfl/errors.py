"""Errors that the CLI turns into one clear message (never a bare traceback)."""

from __future__ import annotations


class ClusterFLError(Exception):
    """Base of every error clusterfl raises on purpose."""


class ConfigError(ClusterFLError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    `field` is the dotted path of the offending field (e.g. "scenario.n_clients").
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class DataError(ClusterFLError):
    """A dataset file is missing, truncated, corrupted or of the wrong format."""
