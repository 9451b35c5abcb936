"""The tool menu as a model step reads it: by reference, from the ledger (claim-check).

A `step.requested` names its menu by digest (`tools_digest`; shared/tool_menu.py).
The model-step reads the `tool_menus` row with its own read-only role, checks that
the descriptions are the ones the digest names (a row rewritten in the database is
refused, the step reported as failed), and keeps the checked menu in memory: a
digest names one menu forever, so each menu is read once per process, and the
steps after it cost no statement and no validation of the descriptions.
"""

from __future__ import annotations

from collections import OrderedDict

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.ledger import driver
from shared.ledger.tables import TABLES
from shared.messages import ToolDescription
from shared.tool_menu import checked

TOOL_MENUS = TABLES["tool_menus"]
# The menus a model-step keeps: one per catalogue in use (a reload makes another), a
# few besides for steps still queued from before; the oldest go first.
KEPT = 16

# A menu by its digest: the model-step reads it here, the ledger's store (store_sql.py) too.
MENU_BY_DIGEST = select(TOOL_MENUS.c.descriptions).where(TOOL_MENUS.c.digest == bindparam("digest"))


class LedgerToolMenus:
    """Reads a step's tool menu from the ledger (the model-step's role may only read it),
    checked, and keeps it by digest."""

    def __init__(self, engine: AsyncEngine, kept: int = KEPT) -> None:
        self.engine = engine
        self.kept = kept
        self._menus: OrderedDict[str, list[ToolDescription]] = OrderedDict()

    async def read(self, digest: str) -> list[ToolDescription]:
        menu = self._menus.get(digest)
        if menu is not None:
            self._menus.move_to_end(digest)
            return menu
        async with self.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                # Outside a transaction, as the transcript's read (shared/ledger/transcripts.py):
                # one statement, and a row that is never changed.
                rows = [record.descriptions for record in await driver.fetch(conn, MENU_BY_DIGEST, {"digest": digest})]
            else:
                rows = list(await conn.scalars(MENU_BY_DIGEST, {"digest": digest}))
        # Checked before it is kept: only a menu whose digest holds is ever reused.
        menu = checked(rows[0] if rows else None, digest)
        self._menus[digest] = menu
        while len(self._menus) > self.kept:
            self._menus.popitem(last=False)
        return menu
