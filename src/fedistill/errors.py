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


def unknown_name(kind: str, value: object, valid: list[str], error: type[UserError] = UserError) -> UserError:
    """The error for a name that is not one of `valid`: it lists them and suggests the closest one."""
    import difflib

    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return error(f"unknown {kind} {value!r}{hint} (valid: {', '.join(valid)})")


class RunDirError(UserError):
    """A run directory that cannot be used as asked: damaged, locked, not a run, or unwritable."""
