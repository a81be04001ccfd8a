"""What goes wrong in a person's request: each error says what to do instead."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from a person: the message is shown as is; nothing was written."""

    def __init__(self, message: str, *, errors: dict[str, str] | None = None,
                 status: int = 400) -> None:  # fmt: skip
        super().__init__(message)
        self.errors = errors or {}
        self.status = status  # 400, or 413 for a request too large to take


class AdmissionError(Exception):
    """Too much queued work; the caller answers 429 with Retry-After."""

    def __init__(self, message: str, *, retry_after: int, reason: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason  # "user_limit" | "global_limit": the label of the 429 counter


class ConflictError(Exception):
    """A compare-and-set lost: the draft changed since the person looked at it."""
