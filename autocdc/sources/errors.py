"""Errors of the change sources: each says what is wrong on the database side and the fix."""

from __future__ import annotations

from autocdc.engine.errors import AutoCdcError


class SourceOptionError(AutoCdcError):
    error_class = "AUTOCDC_SOURCE_OPTION"
    template = "Option `{option}` of the {source} source {problem}. {fix}"


class WalLevelError(AutoCdcError):
    error_class = "AUTOCDC_POSTGRES_WAL_LEVEL"
    template = (
        "PostgreSQL runs with wal_level={level}; log-based capture needs wal_level=logical. "
        "Set it in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server."
    )


class TableNotFoundError(AutoCdcError):
    error_class = "AUTOCDC_POSTGRES_TABLE_NOT_FOUND"
    template = "Table {table} does not exist in the database. Fix the name in option `tables`."


class NoPrimaryKeyError(AutoCdcError):
    error_class = "AUTOCDC_POSTGRES_NO_PRIMARY_KEY"
    template = (
        "Table {table} has no primary key, so its changes cannot be matched to rows. Give "
        "its key columns with option `keys.{table}` (e.g. 'id' or 'a,b'), and set "
        "ALTER TABLE {table} REPLICA IDENTITY FULL so updates and deletes carry them."
    )


class ReplicaIdentityError(AutoCdcError):
    error_class = "AUTOCDC_POSTGRES_REPLICA_IDENTITY"
    template = (
        "Table {table} has no primary key and replica identity '{identity}': its updates and "
        "deletes would not carry the key columns {keys}. Run "
        "ALTER TABLE {table} REPLICA IDENTITY FULL."
    )


class UnknownKeyColumnError(AutoCdcError):
    error_class = "AUTOCDC_POSTGRES_UNKNOWN_KEY_COLUMN"
    template = "Option `keys.{table}` names {columns}, which {table} does not have ({available})."
