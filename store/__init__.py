"""SQLite store: schema, migrations and the home-directory layout. Imports nothing of ours."""

from store.db import SCHEMA_VERSION, StoreError, connect, migrate
from store.home import Home, resolve_home

__all__ = ["SCHEMA_VERSION", "Home", "StoreError", "connect", "migrate", "resolve_home"]
