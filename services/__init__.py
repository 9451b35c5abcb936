"""Signoff's four services and its command line."""
