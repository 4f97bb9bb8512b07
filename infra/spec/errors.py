"""The one error type for bad configuration: it names the field, the value and the fix."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """Raised on construction of a spec object whose value cannot work.

    The message always names the offending field, the value given, and what
    would be accepted, so a user can fix it without reading the code.
    """

    def __init__(self, field: str, value: object, allowed: str | Iterable[str], fix: str = "") -> None:
        allowed_text = allowed if isinstance(allowed, str) else ", ".join(sorted(allowed))
        message = f"{field}={value!r} is invalid; allowed: {allowed_text}"
        if fix:
            message += f". Fix: {fix}"
        super().__init__(message)
        self.field = field
        self.value = value
        self.allowed = allowed_text
