"""Alembic revisions, oldest first; each file names the revision it follows."""
