"""The one exception type a user sees: entrypoint.py prints it as one line and exits 2, before anything starts."""


class UsageError(Exception):
    """Bad input; the message names the problem and the fix."""
