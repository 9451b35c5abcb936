"""The ledger's schema: tables, migrations, engines and the notify channel.

Every service that reads or writes the ledger imports it from here, never from
the approval-ledger service, which owns the state but not the schema's code."""
