"""gateway logins ended before their time (logouts), on record in the database: Redis
only caches them, so losing its keys brings no ended login back

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ended_logins",
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("principal", sa.String(256), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("ended_logins")
