"""One exception type for every mistake a user can make, each naming its fix."""

from __future__ import annotations


class WorkshopError(Exception):
    """A problem found before (or instead of) spending anything, with the fix spelled out.

    The message says what is wrong; `fix` says what to do about it. Both show in a
    notebook's traceback and in the CLI's one-line error.
    """

    def __init__(self, message: str, fix: str | None = None):
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\n  Fix: {fix}" if fix else message)
