"""Postgres: each module holds the SQL it runs."""
