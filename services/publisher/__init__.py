"""publisher: relays the ledger's committed outbox to RabbitMQ."""
