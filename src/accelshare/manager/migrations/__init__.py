"""Alembic migrations of the manager database (run through ``accelshare.manager.schema``)."""
