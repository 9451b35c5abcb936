"""The audit log's chains as pure functions (shared/audit.py): how entries are
chained per session and linked globally, and what `verify` finds when an entry is
changed, removed, rewritten with its hashes, or left out of the global chain.
No database: the rows are dicts as the tables hold them."""

import copy
import json
from datetime import UTC, datetime, timedelta

from shared import audit

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def record(*sessions_kinds: tuple[str, str]) -> tuple[list[dict], list[dict], dict]:
    """Entries made as the ledger makes them (each chained to its session's head),
    given ids and PostgreSQL transaction ids in write order, then all linked."""
    heads: dict[str, tuple[int, str | None]] = {}
    entries = []
    for number, (session_id, kind) in enumerate(sessions_kinds, start=1):
        entry = audit.chained(
            session_id=session_id,
            head=heads.get(session_id, (0, None)),
            kind=kind,
            subject=f"call_{number}",
            actor="alice",
            message_id=f"msg_{number}",
            detail={"tool": "publish_post", "call_digest": audit.digest_of({"n": number})},
            at=T0 + timedelta(seconds=number),
        )
        heads[session_id] = (entry["session_seq"], entry["hash"])
        entries.append({**entry, "id": number, "txid": 1000 + number})
    chain = audit.links(((e["id"], e["hash"]) for e in entries), (0, None))
    head = {"seq": chain[-1]["seq"], "hash": chain[-1]["hash"], "horizon": 1000 + len(entries) + 1}
    return entries, chain, head


STORY = [("ses_a", "turn.started"), ("ses_b", "turn.started"), ("ses_a", "call.proposed"),
         ("ses_a", "approval.requested"), ("ses_b", "call.proposed"), ("ses_a", "response.accepted")]


def test_each_entry_names_the_hash_of_its_sessions_entry_before_it_and_each_link_the_link_before():
    entries, chain, _ = record(*STORY)
    a = [e for e in entries if e["session_id"] == "ses_a"]
    assert [e["session_seq"] for e in a] == [1, 2, 3, 4]
    assert a[0]["prev_hash"] is None and all(later["prev_hash"] == earlier["hash"] for earlier, later in zip(a, a[1:]))
    assert [link["seq"] for link in chain] == [1, 2, 3, 4, 5, 6]
    assert chain[0]["prev_hash"] is None
    assert all(later["prev_hash"] == earlier["hash"] for earlier, later in zip(chain, chain[1:]))


def test_an_untouched_record_verifies_on_either_store():
    entries, chain, head = record(*STORY)
    for by_txid, horizon in ((True, head["horizon"]), (False, entries[-1]["id"])):
        verdict = audit.verify(entries, chain, {**head, "horizon": horizon}, by_txid=by_txid)
        assert verdict.intact and (verdict.entries, verdict.linked, verdict.pending) == (6, 6, 0)


def test_a_changed_entry_is_named_even_when_later_ones_are_intact():
    entries, chain, head = record(*STORY)
    entries[2]["detail"] = {**entries[2]["detail"], "tool": "delete_everything"}
    broken = audit.verify(entries, chain, head, by_txid=True).broken
    assert broken is not None and (broken.entry_id, broken.session_id, broken.session_seq) == (3, "ses_a", 2)
    assert "does not match its hash" in broken.reason


def test_a_changed_time_or_actor_is_named_too():
    for field, value in (("recorded_at", T0), ("actor", "mallory"), ("session_seq", 7)):
        entries, chain, head = record(*STORY)
        entries[3][field] = value
        broken = audit.verify(entries, chain, head, by_txid=True).broken
        assert broken is not None and broken.entry_id == 4, field


def test_an_entry_rewritten_with_a_fresh_hash_breaks_its_sessions_next_entry_and_the_global_link():
    entries, chain, head = record(*STORY)
    forged = entries[2]
    forged["detail"] = {"tool": "delete_everything"}
    forged["hash"] = audit.entry_hash(forged, forged["prev_hash"])
    broken = audit.verify(entries, chain, head, by_txid=True).broken
    assert broken is not None and broken.entry_id == 3
    assert "global chain linked" in broken.reason
    # Without the global chain, the session chain alone names the entry after it.
    alone = audit.first(audit.session_problems(entries))
    assert alone is not None and alone.entry_id == 4 and "before it" in alone.reason


def test_a_whole_session_chain_rewritten_is_still_caught_by_the_global_chain():
    entries, chain, head = record(*STORY)
    head_of = (0, None)
    for entry in (e for e in entries if e["session_id"] == "ses_a"):
        entry["actor"] = "mallory"
        entry["prev_hash"] = head_of[1]
        entry["hash"] = audit.entry_hash(entry, entry["prev_hash"])
        head_of = (entry["session_seq"], entry["hash"])
    assert audit.session_problems(entries) == []
    broken = audit.verify(entries, chain, head, by_txid=True).broken
    assert broken is not None and broken.entry_id == 1


def test_a_deleted_entry_is_named_by_the_sessions_next_entry_and_the_link_that_named_it():
    entries, chain, head = record(*STORY)
    del entries[2]  # ses_a #2
    problems = audit.session_problems(entries)
    assert [(p.entry_id, p.session_seq) for p in problems] == [(4, 3)] and "#2" in problems[0].reason
    verdict = audit.verify(entries, chain, head, by_txid=True)
    assert verdict.broken is not None and verdict.broken.entry_id == 4


def test_the_last_entries_deleted_with_their_links_leave_a_head_that_says_so():
    entries, chain, head = record(*STORY)
    broken = audit.verify(entries[:-1], chain[:-1], head, by_txid=True).broken
    assert broken is not None and broken.entry_id is None and "chain head" in broken.reason


def test_an_entry_the_linker_has_passed_must_be_linked_and_a_newer_one_may_wait():
    entries, chain, head = record(*STORY)
    # Written after the last linking pass: its session chain checked, not yet linked.
    verdict = audit.verify(entries, chain[:-1], {**head, "seq": 5, "hash": chain[4]["hash"], "horizon": 1006},
                           by_txid=True)
    assert verdict.intact and verdict.pending == 1
    # Below the horizon but not linked: its link was removed (or it was slipped in later).
    verdict = audit.verify(entries, chain[:-1], {**head, "seq": 5, "hash": chain[4]["hash"]}, by_txid=True)
    assert verdict.broken is not None and verdict.broken.entry_id == 6 and "missing from the global chain" in \
        verdict.broken.reason
    assert audit.linked_below({"id": 6, "txid": None}, 6, by_txid=False)
    assert not audit.linked_below({"id": 7, "txid": None}, 6, by_txid=False)


def test_a_link_removed_from_the_middle_of_the_global_chain_is_named():
    entries, chain, head = record(*STORY)
    del chain[2]
    broken = audit.verify(entries, chain, head, by_txid=True).broken
    assert broken is not None and broken.entry_id == 3


def test_an_entry_of_a_session_not_on_record_is_chained_globally_only():
    entry = audit.chained(session_id="ses_unknown", head=None, kind="response.rejected", subject="apr_x",
                          actor="bob", message_id="msg_1", detail={"reason_code": "unknown_request"}, at=T0)
    assert entry["session_seq"] is None and entry["prev_hash"] is None
    row = {**entry, "id": 1, "txid": 5}
    chain = audit.links([(1, entry["hash"])], (0, None))
    assert audit.verify([row], chain, {"seq": 1, "hash": chain[0]["hash"], "horizon": 6}, by_txid=True).intact


def test_the_hash_survives_the_round_trip_through_a_database_and_json():
    entries, _, _ = record(*STORY)
    entry = copy.deepcopy(entries[0])
    # As read back: detail parsed from JSON, the time in UTC as stored.
    entry["detail"] = json.loads(json.dumps(entry["detail"]))
    entry["recorded_at"] = entry["recorded_at"].astimezone(UTC)
    assert audit.entry_hash(entry, entry["prev_hash"]) == entries[0]["hash"]


def test_the_story_reads_as_a_person_tells_it():
    detail = {"decision": "approve", "channel": "cli", "count": None}
    line = audit.story({"kind": "response.accepted", "subject": "apr_1", "actor": "bob", "detail": detail,
                        "message_id": "msg_1"})
    assert line == "bob approved apr_1 via channel cli"
    rejected = {"kind": "response.rejected", "subject": "apr_1", "actor": "eve", "message_id": "m",
                "detail": {"reason_code": "digest_mismatch", "reason_text": "not the arguments shown"}}
    assert audit.story(rejected) == "a response by eve to apr_1 was refused: digest_mismatch: not the arguments shown"


def test_the_story_of_an_edit_says_who_changed_what_both_digests_and_the_count_it_restarted():
    detail = {"tool": "refund", "edit": "amount: 5000 → 4000", "changed": ["amount"],
              "original_digest": "hmac-sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaa", "edited_digest": "hmac-sha256:bbbb",
              "approvals_required": 2, "reason": "amount 4,000 > 1,000: two approvers", "approvals_withdrawn": 1}
    line = audit.story({"kind": "arguments.edited", "subject": "apr_1", "actor": "alice", "detail": detail,
                        "message_id": "m"})
    assert line == (
        "alice edited the arguments of apr_1 (refund) before approving: amount: 5000 → 4000; "
        "digest hmac-sha256:aaaaaaaaaaa… → hmac-sha256:bbbb, 2 approval(s) needed "
        "(amount 4,000 > 1,000: two approvers); 1 earlier approval(s) no longer count")
    # Entries made before the edit's diff and withdrawn count were recorded: the fields changed.
    older = {k: v for k, v in detail.items() if k not in ("edit", "reason", "approvals_withdrawn")}
    assert audit.story({"kind": "arguments.edited", "subject": "apr_1", "actor": "alice", "detail": older,
                        "message_id": "m"}) == (
        "alice edited the arguments of apr_1 (refund) before approving (amount); "
        "digest hmac-sha256:aaaaaaaaaaa… → hmac-sha256:bbbb, 2 approval(s) needed")
