"""who may approve: each approval counted once, response tokens, who started a turn

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("responder", sa.String(length=256), nullable=False),
        sa.Column("response_id", sa.String(length=64), nullable=False),
        sa.Column("message_id", sa.String(length=64), nullable=False),
        sa.Column("channel", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("approved_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["request_id"], ["approval_requests.id"]),
        sa.PrimaryKeyConstraint("request_id", "responder"),
        sa.UniqueConstraint("response_id"),
    )
    with op.batch_alter_table("approval_requests") as batch:
        batch.add_column(sa.Column("response_token_hash", sa.String(length=100), nullable=True))
        batch.add_column(sa.Column("token_used_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("started_by", sa.String(length=256), nullable=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("started_by", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("started_by")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("started_by")
    with op.batch_alter_table("approval_requests") as batch:
        batch.drop_column("token_used_at")
        batch.drop_column("response_token_hash")
    op.drop_table("approvals")
