"""The one exception type. Raised where bad input is first seen; the CLI prints its message
as one line and exits non-zero."""


class PrefixEdgeError(Exception):
    """A user-facing error with a message that says what is wrong and what to do."""

    exit_code = 1
