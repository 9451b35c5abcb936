"""Signoff's shared package: message schemas, settings, topology and the consumer loop."""
