"""request lifetimes and provenance: each request's deadline, and the turn, step,
model attempt and ledger run that made it

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approval_requests") as batch:
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("turn_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("step_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("run_id", sa.String(length=64), nullable=True))
    op.create_index("ix_approval_requests_due", "approval_requests", ["status", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_approval_requests_due", table_name="approval_requests")
    with op.batch_alter_table("approval_requests") as batch:
        for column in ("run_id", "attempt", "step_id", "turn_id", "expires_at"):
            batch.drop_column(column)
