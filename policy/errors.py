"""The one error type of the policy package.

Every rejection — a bad field, a syntax error in a file, a corrupt snapshot — is a
:class:`PolicyError` naming *where* (a dotted path such as ``spec.zones[2]``) and *what*, so the
admin API can turn it into INVALID_ARGUMENT with a message an operator can act on.
"""

from __future__ import annotations


class PolicyError(ValueError):
    """A policy document, file, command or snapshot was rejected.

    ``field`` is a dotted path into the input ("kind", "spec.deadline_ms", "spec.zones[2]",
    "documents[1].name") or, for whole-file problems, the file's name. ``str(err)`` is
    ``"<field>: <message>"``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message

    def prefixed(self, prefix: str) -> PolicyError:
        """The same error located inside ``prefix`` (e.g. ``documents[1]`` or ``snapshot``)."""
        if not self.field:
            return PolicyError(prefix, self.message)
        sep = "" if self.field.startswith("[") else "."
        return PolicyError(f"{prefix}{sep}{self.field}", self.message)
