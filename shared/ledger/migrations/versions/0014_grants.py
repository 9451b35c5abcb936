"""approve and remember: a person's approval may be remembered as a grant, a row that
authorizes later matching calls of its session with no card until it expires or is
revoked; a call so authorized names its grant

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "grants",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id"), nullable=False, index=True),
        sa.Column("request_id", sa.String(64), sa.ForeignKey("approval_requests.id"), nullable=False, unique=True),
        sa.Column("granted_by", sa.String(256), nullable=False),
        sa.Column("tool", sa.String(256), nullable=False),
        sa.Column("tool_version", sa.String(64), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("approvals_required", sa.Integer(), nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(256), nullable=True),
        sa.Column("grant_seal", sa.Text(), nullable=False),
    )
    # Nullable: a call asked for or run by policy names no grant.
    with op.batch_alter_table("tool_calls") as batch:
        batch.add_column(sa.Column("grant_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tool_calls") as batch:
        batch.drop_column("grant_id")
    op.drop_table("grants")
