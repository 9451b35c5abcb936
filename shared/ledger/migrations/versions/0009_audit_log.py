"""the audit log: entries chained per session, the global chain and its head

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("audit_seq", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("audit_hash", sa.String(length=80), nullable=True))
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("session_seq", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=True),
        sa.Column("actor", sa.String(length=256), nullable=True),
        sa.Column("message_id", sa.String(length=64), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prev_hash", sa.String(length=80), nullable=True),
        sa.Column("hash", sa.String(length=80), nullable=False),
        # The writing transaction's id: the global chain links entries in this order,
        # once no transaction below it is still running (services/approval_ledger/audit.py).
        sa.Column(
            "txid",
            sa.BigInteger(),
            nullable=True,
            server_default=sa.text("(pg_current_xact_id()::text::bigint)") if postgres else None,
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("session_id", "session_seq"),
    )
    op.create_index("ix_audit_log_txid", "audit_log", ["txid"])
    op.create_table(
        "audit_chain",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("entry_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("entry_hash", sa.String(length=80), nullable=False),
        sa.Column("prev_hash", sa.String(length=80), nullable=True),
        sa.Column("hash", sa.String(length=80), nullable=False),
        sa.Column("linked_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["entry_id"], ["audit_log.id"]),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("entry_id"),
    )
    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(length=80), nullable=True),
        sa.Column("horizon", sa.BigInteger(), nullable=False),
        sa.Column("linked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(head, [{"id": 1, "seq": 0, "horizon": 0}])


def downgrade() -> None:
    op.drop_table("audit_head")
    op.drop_table("audit_chain")
    op.drop_index("ix_audit_log_txid", table_name="audit_log")
    op.drop_table("audit_log")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("audit_hash")
        batch.drop_column("audit_seq")
