"""publisher leadership epoch (the relay's fence); hook deliveries given up, read per hook

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_PENDING = sa.text("delivered_at IS NULL AND given_up_at IS NULL")


def upgrade() -> None:
    leader = op.create_table(
        "publisher_leader",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    # The one row: a publisher that takes the lead only ever updates it.
    op.bulk_insert(leader, [{"id": 1, "epoch": 0}])
    with op.batch_alter_table("hook_deliveries") as batch:
        batch.add_column(sa.Column("given_up_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("given_up_reason", sa.String(length=32), nullable=True))
        batch.drop_index("ix_hook_due")
    op.create_index(
        "ix_hook_pending",
        "hook_deliveries",
        ["hook", "next_attempt_at"],
        postgresql_where=_PENDING,
        sqlite_where=_PENDING,
    )


def downgrade() -> None:
    op.drop_index("ix_hook_pending", table_name="hook_deliveries")
    with op.batch_alter_table("hook_deliveries") as batch:
        batch.create_index("ix_hook_due", ["delivered_at", "next_attempt_at"], unique=False)
        batch.drop_column("given_up_reason")
        batch.drop_column("given_up_at")
    op.drop_table("publisher_leader")
