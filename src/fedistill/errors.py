"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input (name, value, file, config) with a message that says what to change."""


class DataError(UserError):
    """A dataset file is missing, corrupt or in the wrong format."""


class ConfigError(UserError):
    """A configuration key or value is unknown or invalid."""


class PartitionError(UserError):
    """A partition request that cannot be satisfied (alpha <= 0, too many clients, retries exhausted, ...)."""


class FederationError(RuntimeError):
    """The protocol cannot go on: too few clients answered, a message failed validation, ..."""
