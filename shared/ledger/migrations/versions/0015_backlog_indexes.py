"""costs that stay flat as the backlog grows: partial indexes on the pending
requests for the sweeps, the per-session reads and the gauge, each request's tool kept
with it, the pending count kept by triggers in `pending_tally`, and the time indexes
retention deletes by

Revision ID: 0015
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

PENDING = "status = 'pending'"
# name -> (columns, predicate): every one holds only the pending rows, so its size and
# the cost of reading its head follow what is due, not how many wait.
PARTIAL = {
    # The expiry sweep (`_DUE`): the first entries are the first to expire.
    "ix_approval_requests_pending_expiry": (["expires_at"], f"{PENDING} AND expires_at IS NOT NULL"),
    # The escalation sweep (`_DUE_ESCALATIONS`): only what is still to be escalated.
    "ix_approval_requests_pending_escalation": (
        ["escalate_at"],
        f"{PENDING} AND escalate_at IS NOT NULL AND escalated_at IS NULL",
    ),
    # A session's pending requests (the approval path's per-session reads), in order.
    "ix_approval_requests_pending_session": (["session_id", "created_at", "id"], PENDING),
    # The gauge: each tool's oldest and first to expire, and `signoff pending`'s pages.
    "ix_approval_requests_pending_tool_age": (["tool", "created_at"], PENDING),
    "ix_approval_requests_pending_tool_expiry": (["tool", "expires_at"], f"{PENDING} AND expires_at IS NOT NULL"),
}

# The count of pending requests per tool, as deltas (+1 a request became pending, -1 it
# stopped): a trigger adds one row per change in the changing transaction, so the count
# is exactly what committed, after any crash, without a row every writer must lock
# (two ledger replicas would serialize on it, or deadlock on two tools). The gauge sums
# the rows and folds them into one per tool (shared/ledger/backlog.py).
_PG_FUNCTION = """
CREATE FUNCTION pending_tally_count() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.status = 'pending' THEN
        INSERT INTO pending_tally (tool, delta) VALUES (OLD.tool, -1);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.status = 'pending' THEN
        INSERT INTO pending_tally (tool, delta) VALUES (NEW.tool, 1);
    END IF;
    RETURN NULL;
END $$
"""
_PG_TRIGGERS = (
    "CREATE TRIGGER pending_tally_insert AFTER INSERT ON approval_requests FOR EACH ROW"
    " WHEN (NEW.status = 'pending') EXECUTE FUNCTION pending_tally_count()",
    "CREATE TRIGGER pending_tally_update AFTER UPDATE OF status, tool ON approval_requests FOR EACH ROW"
    " WHEN ((OLD.status = 'pending' OR NEW.status = 'pending')"
    " AND (OLD.status IS DISTINCT FROM NEW.status OR OLD.tool IS DISTINCT FROM NEW.tool))"
    " EXECUTE FUNCTION pending_tally_count()",
    "CREATE TRIGGER pending_tally_delete AFTER DELETE ON approval_requests FOR EACH ROW"
    " WHEN (OLD.status = 'pending') EXECUTE FUNCTION pending_tally_count()",
)
# SQLite drops a table's triggers with the table: a later migration that rebuilds
# `approval_requests` (batch "always") must create these again.
_SQLITE_TRIGGERS = (
    "CREATE TRIGGER pending_tally_insert AFTER INSERT ON approval_requests WHEN NEW.status = 'pending'"
    " BEGIN INSERT INTO pending_tally (tool, delta) VALUES (NEW.tool, 1); END",
    "CREATE TRIGGER pending_tally_update_old AFTER UPDATE OF status, tool ON approval_requests"
    " WHEN OLD.status = 'pending' AND (NEW.status IS NOT 'pending' OR OLD.tool IS NOT NEW.tool)"
    " BEGIN INSERT INTO pending_tally (tool, delta) VALUES (OLD.tool, -1); END",
    "CREATE TRIGGER pending_tally_update_new AFTER UPDATE OF status, tool ON approval_requests"
    " WHEN NEW.status = 'pending' AND (OLD.status IS NOT 'pending' OR OLD.tool IS NOT NEW.tool)"
    " BEGIN INSERT INTO pending_tally (tool, delta) VALUES (NEW.tool, 1); END",
    "CREATE TRIGGER pending_tally_delete AFTER DELETE ON approval_requests WHEN OLD.status = 'pending'"
    " BEGIN INSERT INTO pending_tally (tool, delta) VALUES (OLD.tool, -1); END",
)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    # The request's tool, kept with it (it never changes): the gauge and the pages read
    # each tool's pending requests from an index, without a join to every call.
    with op.batch_alter_table("approval_requests") as batch:
        batch.add_column(sa.Column("tool", sa.String(256), nullable=True))
    op.execute(
        "UPDATE approval_requests"
        " SET tool = (SELECT tool FROM tool_calls WHERE tool_calls.id = approval_requests.call_id)"
    )
    for name, (columns, where) in PARTIAL.items():
        op.create_index(
            name, "approval_requests", columns, postgresql_where=sa.text(where), sqlite_where=sa.text(where)
        )
    # Retention deletes by these times (shared/ledger/retention.py).
    op.create_index("ix_inbox_received", "inbox", ["received_at"])
    op.create_table(
        "pending_tally",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("tool", sa.String(256), nullable=True),
        sa.Column("delta", sa.Integer(), nullable=False),
    )
    op.execute(
        "INSERT INTO pending_tally (tool, delta)"
        " SELECT tool, count(*) FROM approval_requests WHERE status = 'pending' GROUP BY tool"
    )
    if postgres:
        # Two rows per request (+1, -1), deleted by each fold: vacuumed often where autovacuum
        # runs, so the gauge's read stays a few pages (without it, it grows with the churn).
        op.execute(
            "ALTER TABLE pending_tally SET (autovacuum_vacuum_threshold = 1000,"
            " autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000)"
        )
        op.execute(_PG_FUNCTION)
        for trigger in _PG_TRIGGERS:
            op.execute(trigger)
    else:
        for trigger in _SQLITE_TRIGGERS:
            op.execute(trigger)


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    triggers = ("insert", "update", "update_old", "update_new", "delete")
    for name in (f"pending_tally_{trigger}" for trigger in triggers):
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + (" ON approval_requests" if postgres else ""))
    if postgres:
        op.execute("DROP FUNCTION IF EXISTS pending_tally_count()")
    op.drop_table("pending_tally")
    op.drop_index("ix_inbox_received", table_name="inbox")
    for name in PARTIAL:
        op.drop_index(name, table_name="approval_requests")
    with op.batch_alter_table("approval_requests") as batch:
        batch.drop_column("tool")
