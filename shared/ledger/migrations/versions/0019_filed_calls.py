"""the intake: calls filed by programs, unique by (program, caller's call id), with the
claim of a call its caller runs and the ledger's signed verdict

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UNREPORTED = "reported_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "filed_calls",
        sa.Column("id", sa.String(64), sa.ForeignKey("tool_calls.id"), primary_key=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("program", sa.String(256), nullable=False),
        sa.Column("caller_call_id", sa.String(256), nullable=False),
        sa.Column("origin", sa.String(100), nullable=False),
        sa.Column("thread", sa.String(256), nullable=True),
        sa.Column("summary", sa.String(300), nullable=True),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("args_fingerprint", sa.String(100), nullable=False),
        sa.Column("runs", sa.String(16), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claim_token_hash", sa.String(100), nullable=True),
        sa.Column("claim_holder", sa.String(128), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("verdict", sa.Text(), nullable=True),
        sa.UniqueConstraint("program", "caller_call_id", name="uq_filed_calls_program_call"),
    )
    op.create_index(
        "ix_filed_calls_lease",
        "filed_calls",
        ["lease_expires_at"],
        postgresql_where=sa.text(UNREPORTED),
        sqlite_where=sa.text(UNREPORTED),
    )


def downgrade() -> None:
    op.drop_index("ix_filed_calls_lease", table_name="filed_calls")
    op.drop_table("filed_calls")
