"""The tools a model step offers the model, named by their digest (claim-check).

A `step.requested` names the catalogue's tool descriptions by a digest instead of
carrying them (with their JSON schemas, a few kilobytes per step, twice per
approval round trip): the ledger stores each menu once, in the `tool_menus` table,
keyed by that digest, in the transaction of the first step that names it, and the
model-step reads it with its own read-only role, checks the digest and keeps it in
memory (shared/ledger/tool_menus.py). A menu is content-addressed: a digest names
one list of descriptions forever, so a menu read and checked once may be reused for
every later step that names it, and a catalogue reloaded with other tools names a
new menu.

No database here: the catalogue computes its menu (once per loaded catalogue), and
so do the processes that never touch the ledger.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shared.messages import ToolDescription


def digest_of(descriptions: list[dict[str, Any]]) -> str:
    """The digest of a menu: its descriptions (JSON-mode dumps) as canonical JSON, sorted
    keys and no spaces (the ledger and the model-step make the same bytes; key order as
    stored or read back does not matter), hashed with SHA-256."""
    body = json.dumps(descriptions, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolMenu:
    """A catalogue's descriptions as stored (JSON-mode dumps), and their digest."""

    digest: str
    descriptions: list[dict[str, Any]]

    @classmethod
    def of(cls, descriptions: list[ToolDescription]) -> ToolMenu:
        dumped = [description.model_dump(mode="json") for description in descriptions]
        return cls(digest_of(dumped), dumped)


class ToolMenuMismatch(Exception):
    """The ledger's row is not the menu the step was asked to offer (rewritten, missing, or
    not descriptions): it fails the same way on every delivery, so the step reports it
    instead of being redelivered."""


def checked(found: Any, digest: str) -> list[ToolDescription]:
    """The descriptions of a stored menu, if it is the menu whose digest is `digest`;
    `found`: the row's descriptions (None: there is no such row)."""
    if found is None:
        raise ToolMenuMismatch(f"the ledger holds no tool menu {digest}")
    if not isinstance(found, list):
        raise ToolMenuMismatch(f"the tool menu {digest} as stored is not a list of descriptions")
    stored = digest_of(found)
    if stored != digest:
        raise ToolMenuMismatch(f"the tool menu's digest is {stored}, not {digest} as asked for")
    try:
        return [ToolDescription.model_validate(description) for description in found]
    except ValidationError as broken:
        raise ToolMenuMismatch(f"a stored description is not a tool description: {broken}") from None
