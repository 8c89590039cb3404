"""Errors that reach users as one clear line (never a traceback)."""


class RealsimError(Exception):
    """Bad input or an unrecoverable condition; the message is shown to the user as is."""
