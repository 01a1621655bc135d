"""The base of every published message: a versioned CloudEvents type and its subject."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Message(BaseModel):
    """A command or event body. `TYPE` is the CloudEvents type; change a version only by adding fields."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    TYPE: ClassVar[str]
    SUBJECT: ClassVar[str]
    SUMMARY: ClassVar[str] = ""

    def subject(self) -> str:
        """The NATS subject this message goes to; per-node samples override it."""
        return self.SUBJECT

    def key(self) -> str:
        """The CloudEvents `subject` (what the message is about, such as a job id)."""
        return ""


class FieldError(BaseModel):
    """One reason a submission was refused, with the path of the offending field."""

    model_config = ConfigDict(frozen=True)

    field: str
    reason: str
