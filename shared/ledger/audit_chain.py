"""The global audit chain, linked after commit: every audit entry, in an order
that every ledger replica agrees on, chained to the link before it
(shared/audit.py), under a lock on the chain's head row.

Entries are chained per session inside their transition (the session's row
lock orders them); the global chain is not, so ledger replicas never wait for
each other at commit. A linking pass takes the entries no running transaction
can still add to, in a fixed order, and links them:

- PostgreSQL: each entry carries its writing transaction's id (`txid`). Every id
  below the oldest running transaction (`pg_snapshot_xmin`) is final, committed
  or rolled back, so the pass links entries with `horizon <= txid < xmin` in
  (txid, id) order and moves the horizon to xmin. An entry still being written
  has a txid at or above xmin and is linked by a later pass, never skipped.
- SQLite: one writer at a time, so ids are commit order: entries past the last
  linked id, in id order.

Two replicas linking at once queue on the head row (`FOR UPDATE`); the second
finds the first's horizon and links only what is left. The ledger runs a pass on a
timer (services/approval_ledger/audit.py).
"""

from __future__ import annotations

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from shared import audit
from shared.ledger.tables import TABLES
from shared.messages import now

AUDIT, CHAIN, HEAD = TABLES["audit_log"], TABLES["audit_chain"], TABLES["audit_head"]

_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
_LOCK_HEAD = select(HEAD.c.seq, HEAD.c.hash, HEAD.c.horizon).where(HEAD.c.id == 1).with_for_update()
_FINAL_SINCE = {
    "postgresql": select(AUDIT.c.id, AUDIT.c.hash, AUDIT.c.txid)
    .where(AUDIT.c.txid >= bindparam("horizon"), AUDIT.c.txid < bindparam("below"))
    .order_by(AUDIT.c.txid, AUDIT.c.id),
    "sqlite": select(AUDIT.c.id, AUDIT.c.hash, AUDIT.c.id)
    .where(AUDIT.c.id > bindparam("horizon"))
    .order_by(AUDIT.c.id),
}
_MOVE_HEAD = update(HEAD).where(HEAD.c.id == 1)


async def link_once(engine: AsyncEngine) -> int:
    """Link every entry that is final and not yet linked; how many were linked."""
    async with engine.begin() as conn:
        dialect = conn.dialect.name
        below = (await conn.execute(_XMIN)).scalar_one() if dialect == "postgresql" else None
        head = (await conn.execute(_LOCK_HEAD)).one()
        final = (await conn.execute(_FINAL_SINCE[dialect], {"horizon": head.horizon, "below": below})).all()
        if not final:
            return 0
        at = now()
        made = audit.links(((row[0], row[1]) for row in final), (head.seq, head.hash))
        await conn.execute(CHAIN.insert(), [{**link, "linked_at": at} for link in made])
        # PostgreSQL: every transaction below xmin is done; SQLite: the last id linked.
        horizon = max(head.horizon, below) if below is not None else final[-1][2]
        await conn.execute(_MOVE_HEAD.values(seq=made[-1]["seq"], hash=made[-1]["hash"], horizon=horizon, linked_at=at))
        return len(made)
