"""The plugins' store: one port (base.py), SQLite embedded (sqlite.py), PostgreSQL shared (postgres.py)."""
