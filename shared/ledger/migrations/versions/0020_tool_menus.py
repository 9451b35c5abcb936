"""tool menus: the tools a model step offers, stored once by their digest, which a
model-step request names instead of carrying the descriptions (claim-check)

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tool_menus",
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("descriptions", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tool_menus")
