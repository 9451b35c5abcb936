"""the outbox's commit order: each row's writing transaction id (PostgreSQL), by which
the gateway streams events in an order no later commit can slip into; on SQLite, ids never reused

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    # SQLite: the table is rebuilt with AUTOINCREMENT, so an outbox id is never handed out
    # twice, even after retention deleted the newest rows (a plain rowid would restart
    # below an id a client already saw, and its Last-Event-ID would skip the new events).
    with op.batch_alter_table(
        "outbox",
        recreate="auto" if postgres else "always",
        table_kwargs={} if postgres else {"sqlite_autoincrement": True},
    ) as batch:
        batch.add_column(
            sa.Column(
                "txid",
                sa.BigInteger(),
                nullable=True,
                server_default=sa.text("(pg_current_xact_id()::text::bigint)") if postgres else None,
            )
        )
    op.create_index("ix_outbox_txid", "outbox", ["txid", "id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_txid", table_name="outbox")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("txid")
