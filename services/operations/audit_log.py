"""`signoff audit verify|show|export`: the audit log's hash chain checked, one session's
story, the log as JSON lines."""

from __future__ import annotations

import json
import sys

from services.operations.cards import ended_story, turn_outcome
from shared import audit
from shared.ledger.console_reads import ConsoleLedger, chained_by_txid, read_audit
from shared.ledger.tables import Turn
from shared.on_screen import FIELD_CHARS, visible
from shared.settings import Settings


async def audit_verify(settings: Settings) -> int:
    """Check both chains; name the first broken entry and fail if there is one."""
    entries, chain, head = await read_audit(settings)
    verdict = audit.verify(entries, chain, head, by_txid=chained_by_txid(settings))
    if verdict.broken is not None:
        print(f"signoff audit: BROKEN at {visible(verdict.broken.line())}", file=sys.stderr)
        return 1
    head_hash = head["hash"] if head else None
    print(
        f"signoff audit: intact: {verdict.entries} entries, {verdict.linked} in the global chain "
        f"(head #{head['seq'] if head else 0} {head_hash}), {verdict.pending} written since its last link"
    )
    return 0


async def audit_show(settings: Settings, session_id: str) -> int:
    """A session's story from its audit entries, as a person reads it."""
    entries, _, _ = await read_audit(settings, session_id)
    if not entries:
        print(f"signoff: no audit entries for session {session_id}", file=sys.stderr)
        return 1
    broken = audit.first(audit.session_problems(entries))
    state = "chain intact" if broken is None else f"chain BROKEN at {visible(broken.line())}"
    turns = await read_turns(settings, session_id)
    print(f"session {visible(session_id, FIELD_CHARS)}: {len(entries)} audit entries, {state}")
    by_id = {turn.id: turn for turn in turns}
    for entry in entries:
        seq = f"#{entry['session_seq']}" if entry["session_seq"] is not None else "--"
        told = (
            ended_story(entry, by_id.get(entry["subject"]))
            if entry["kind"] == "turn.ended"
            else visible(audit.story(entry))
        )
        print(f"  {entry['recorded_at']:%Y-%m-%d %H:%M:%S.%f}"[:-3] + f"  {seq:>4}  {told}")
    # Where the story ends: how its last turn ended and why, as `session show` says it.
    print(f"  {turn_outcome(turns[-1] if turns else None)}")
    return 0 if broken is None else 1


async def read_turns(settings: Settings, session_id: str) -> list[Turn]:
    """A session's turns, oldest first: what `audit show` tells each one's end with."""
    async with ConsoleLedger(settings) as ledger:
        return await ledger.turns(session_id)


async def audit_export(settings: Settings, output: str | None, session_id: str | None = None) -> int:
    """Every entry (or one session's) as a JSON line, with its place in the global chain
    (null while not yet linked): a copy to keep elsewhere, whose last link anchors it."""
    entries, chain, _ = await read_audit(settings, session_id)
    link_of = {link["entry_id"]: link for link in chain}
    handle = open(output, "w", encoding="utf-8") if output else sys.stdout
    try:
        for entry in entries:
            link = link_of.get(entry["id"])
            line = {
                **{k: v for k, v in entry.items() if k != "txid"},
                "recorded_at": entry["recorded_at"].isoformat(),
                "link": None if link is None else {"seq": link["seq"], "hash": link["hash"]},
            }
            handle.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
    finally:
        if output:
            handle.close()
    if output:
        print(f"signoff audit: {len(entries)} entries written to {output}", file=sys.stderr)
    return 0
