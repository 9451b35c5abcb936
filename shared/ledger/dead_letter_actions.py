"""The one table the operator's console writes in the ledger's database (docs/design.md,
"Services and who owns what"): `dead_letter_actions`, what an operator did with a parked
message (`signoff dead-letters replay|drop`), committed before the parked copy leaves
the queue (`_act_on_dead_letters` in services/operations/parked.py). The console's role may insert
there and read; nothing else writes it."""

from __future__ import annotations

from sqlalchemy import select

from shared.dead_letters import ParkedMessage
from shared.ledger.console_reads import ConsoleLedger
from shared.ledger.tables import DeadLetterAction
from shared.messages import mint, now


async def action_on_record(ledger: ConsoleLedger, parked: ParkedMessage, action: str) -> DeadLetterAction | None:
    """The same action already on record for this parked copy (same message id, same
    parking), if a console recorded it and died before the copy left the queue. A copy
    whose parking time nobody wrote (`?`) cannot be told from another: never matched."""
    if parked.parked_at == "?":
        return None
    async with ledger.sessions() as db:
        query = (
            select(DeadLetterAction)
            .where(
                DeadLetterAction.message_id == parked.message_id[:256],
                DeadLetterAction.parked_at == parked.parked_at[:64],
                DeadLetterAction.action == action,
            )
            .limit(1)
        )
        return await db.scalar(query)


async def record_action(ledger: ConsoleLedger, parked: ParkedMessage, action: str, operator: str, reason: str) -> None:
    """What the operator does with a parked copy, committed before the copy leaves the queue."""
    async with ledger.sessions() as db, db.begin():
        db.add(
            DeadLetterAction(
                id=mint("dla"),
                action=action,
                message_id=parked.message_id[:256],
                message_type=parked.message_type[:64],
                session_id=parked.session_id[:256],
                parked_reason=f"{parked.reason}: {parked.detail}",
                reason=reason,
                operator=operator,
                acted_at=now(),
                parked_at=parked.parked_at[:64],
            )
        )
