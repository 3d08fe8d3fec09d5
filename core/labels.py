"""What a person calls a job or a sweep: a `name`, `tags` and `notes`. They sit beside the
spec, never in it: they are no part of the spec's hash, so renaming makes no new job and
never breaks an Idempotency-Key, and a worker never sees them. Bounded and checked here,
once, for the API's bodies, the CLI and the store. See docs/api.md ("Names, tags, notes")."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from core.errors import InvalidRequest
from core.text import PLAIN_PATTERN

NAME_MAX = 128
TAG_MAX = 64
TAGS_MAX = 16
NOTES_MAX = 4096
TAG_CHARACTERS = "A-Za-z0-9_.:/-"
TAG_PATTERN = rf"^[{TAG_CHARACTERS}]+$"
# Plain text as core.text has it, but a note may run over lines: tab, newline and carriage
# return are allowed, every other control character and bidi override is not.
NOTES_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]*$"


def _trimmed(value: Any) -> Any:
    """Spaces around a name or notes are dropped; what is then empty is no name at all."""
    if isinstance(value, str):
        value = value.strip()
        return value or None
    return value


def _distinct(tags: tuple[str, ...]) -> tuple[str, ...]:
    """Each tag once, in the order first given (case kept: `Exp` and `exp` are two tags)."""
    return tuple(dict.fromkeys(tags))


Name = Annotated[
    Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX, pattern=PLAIN_PATTERN)]
    | None,
    BeforeValidator(_trimmed),
    Field(
        description=f"What people call it: plain text, at most {NAME_MAX} characters, "
        "trimmed; not unique. Empty or null: no name.",
        examples=["resnet18 baseline"],
    ),
]
Tag = Annotated[
    str,
    StringConstraints(min_length=1, max_length=TAG_MAX, pattern=TAG_PATTERN),
    Field(description=f"1 to {TAG_MAX} of {TAG_CHARACTERS}; case is kept.", examples=["baseline"]),
]
Tags = Annotated[
    tuple[Tag, ...],
    AfterValidator(_distinct),
    Field(
        max_length=TAGS_MAX,
        description=f"At most {TAGS_MAX} tags, each 1 to {TAG_MAX} of {TAG_CHARACTERS} "
        "(case kept); a tag given twice is kept once.",
        examples=[["baseline", "team:vision"]],
    ),
]
Notes = Annotated[
    Annotated[str, StringConstraints(min_length=1, max_length=NOTES_MAX, pattern=NOTES_PATTERN)]
    | None,
    BeforeValidator(_trimmed),
    Field(
        description=f"Why it was run: at most {NOTES_MAX} characters, lines allowed. Empty "
        "or null: no notes.",
    ),
]
LABEL_FIELDS = ("name", "tags", "notes")


class Labels(BaseModel):
    """A job's or a sweep's name, tags and notes, as given at submission."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name = None
    tags: Tags = ()
    notes: Notes = None


class LabelsPatch(BaseModel):
    """A change of a job's or a sweep's labels (PATCH): a field left out stays as it is;
    `name` or `notes` null (or empty) removes it; `tags` replaces them all, `add_tags` and
    `remove_tags` change only those named (two people tagging at once both keep theirs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name = None
    notes: Notes = None
    tags: Tags | None = Field(None, description="All the tags, replacing those it has.")
    add_tags: Tags = Field((), description="Tags to add; those it has already stay once.")
    remove_tags: tuple[Tag, ...] = Field(
        (), max_length=TAGS_MAX, description="Tags to take off; one it lacks is no error."
    )

    @field_validator("tags", mode="before")
    @classmethod
    def _tags_not_null(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("give a list ([] takes every tag off), not null")
        return v

    @model_validator(mode="after")
    def _one_way_of_tagging(self) -> LabelsPatch:
        if self.tags is not None and (self.add_tags or self.remove_tags):
            raise ValueError("give tags (all of them) or add_tags/remove_tags, not both")
        if not self.model_fields_set:
            raise ValueError("nothing to change: give name, notes, tags, add_tags or remove_tags")
        return self

    def applied(self, now: Labels) -> Labels:
        """The labels after this change; InvalidRequest (on `add_tags`) past TAGS_MAX."""
        tags = self.tags
        if tags is None:
            kept = [t for t in now.tags if t not in self.remove_tags]
            tags = _distinct((*kept, *self.add_tags))
        if len(tags) > TAGS_MAX:
            problem = f"{len(tags)} tags: at most {TAGS_MAX}; remove some (remove_tags) as you add"
            raise InvalidRequest(
                [{"loc": ["body", "add_tags"], "msg": problem, "type": "too_many_tags"}]
            )
        fields = self.model_fields_set
        return Labels.model_construct(
            name=self.name if "name" in fields else now.name,
            notes=self.notes if "notes" in fields else now.notes,
            tags=tags,
        )


def labels_of(row: Any) -> Labels:
    """A job's or sweep's labels as its row holds them (tags NULL in rows made before them)."""
    return Labels.model_construct(name=row.name, notes=row.notes, tags=tuple(row.tags or ()))


def name_key(name: str | None) -> str | None:
    """How a name is searched by prefix: case-folded, cut to NAME_MAX characters (a prefix
    search matches what a person types whatever its case)."""
    return None if name is None else name.casefold()[:NAME_MAX]
