"""signed responses: a decision records its response id (used once) and channel

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("response_id", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("channel", sa.String(length=64), nullable=True))
        batch.create_unique_constraint("uq_decisions_response_id", ["response_id"])


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_constraint("uq_decisions_response_id", type_="unique")
        batch.drop_column("channel")
        batch.drop_column("response_id")
