"""Delta table upkeep shared by kcompact's tables: vacuuming what is really stale, compacting many small files.

delta-rs lists a removed data file as stale (`DeltaTable.vacuum(dry_run=True)`) until a checkpoint expires its
tombstone, whether or not a vacuum already deleted it, and a vacuum is two commits (VACUUM START, VACUUM END): a
table vacuumed on every run would grow its log by two commits a run for nothing. `vacuum` deletes only when a stale
file is still in the store.
"""

from __future__ import annotations

from collections.abc import Callable

from deltalake import DeltaTable


def relative_path(table_uri: str, path: str) -> str:
    """A data file's path relative to the table (delta-rs hands some as the table's URI or path joined to it)."""
    prefix = table_uri.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def vacuum(table: DeltaTable, table_uri: str, exists: Callable[[str], bool]) -> list[str]:
    """Delete the data files removed longer ago than the table's retention (`delta.deletedFileRetentionDuration`,
    one week unless the table sets another); returns their paths relative to the table. `exists` tells whether a
    relative path is still in the store."""
    stale = [p for p in (relative_path(table_uri, p) for p in table.vacuum(dry_run=True)) if exists(p)]
    if stale:
        table.vacuum(dry_run=False)
    return stale


def compact_if_crowded(table: DeltaTable, max_files: int) -> int:
    """Bin-pack the table's files (Delta's OPTIMIZE, a dataChange=false rewrite) once it holds more than `max_files`;
    returns how many files were rewritten."""
    if len(table.file_uris()) <= max_files:
        return 0
    return int(table.optimize.compact().get("numFilesRemoved", 0))


__all__ = ["compact_if_crowded", "relative_path", "vacuum"]
