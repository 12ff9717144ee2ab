"""Errors of the change sources: each says what is wrong on the database side and the fix."""

from __future__ import annotations

from autocdc.runtime import AutoCdcError


class SourceError(AutoCdcError):
    """An error of a change source (:mod:`autocdc.sources`): a database, a log, a topic or
    an extraction, and how it is declared."""


class SourceOptionError(SourceError):
    error_class = "AUTOCDC_SOURCE_OPTION"
    template = "Option `{option}` of the {source} source {problem}. {fix}"


class WalLevelError(SourceError):
    error_class = "AUTOCDC_POSTGRES_WAL_LEVEL"
    template = (
        "PostgreSQL runs with wal_level={level}; log-based capture needs wal_level=logical. "
        "Set it in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server."
    )


class TableNotFoundError(SourceError):
    error_class = "AUTOCDC_POSTGRES_TABLE_NOT_FOUND"
    template = "Table {table} does not exist in the database. Fix the name in option `tables`."


class NoPrimaryKeyError(SourceError):
    error_class = "AUTOCDC_POSTGRES_NO_PRIMARY_KEY"
    template = (
        "Table {table} has no primary key, so its changes cannot be matched to rows. Give "
        "its key columns with option `keys.{table}` (e.g. 'id' or 'a,b'), and set "
        "ALTER TABLE {table} REPLICA IDENTITY FULL so updates and deletes carry them."
    )


class ReplicaIdentityError(SourceError):
    error_class = "AUTOCDC_POSTGRES_REPLICA_IDENTITY"
    template = (
        "Table {table} has no primary key and replica identity '{identity}': its updates and "
        "deletes would not carry the key columns {keys}. Run "
        "ALTER TABLE {table} REPLICA IDENTITY FULL."
    )


class UnknownKeyColumnError(SourceError):
    error_class = "AUTOCDC_POSTGRES_UNKNOWN_KEY_COLUMN"
    template = "Option `keys.{table}` names {columns}, which {table} does not have ({available})."


class NoCdcOrderError(SourceError):
    error_class = "AUTOCDC_EXTRACT_NO_CDC_ORDER"
    template = (
        "WATERMARK extraction source `{source}` has no `cdc_order`, so nothing tells which "
        "rows changed since the last run. Name the column(s) that advance when a row "
        "changes, e.g. cdc_order=['updated_at'] (or 'version DESC'); or use strategy "
        "STATELESS to read the whole table every run."
    )


class CursorHookMissingError(SourceError):
    error_class = "AUTOCDC_EXTRACT_HOOK_MISSING"
    template = (
        "CUSTOM extraction source `{source}`: its cursor ({cursor}) has no {missing}. A "
        "CUSTOM cursor implements batches(checkpoint), seed(checkpoint), fold(acc, row) and "
        "merge(a, b): add the missing ones, or use strategy WATERMARK with `cdc_order`."
    )


class BadBatchError(SourceError):
    error_class = "AUTOCDC_EXTRACT_BAD_BATCH"
    template = (
        "The cursor of extraction source `{source}` returned {value} from batches(). Return "
        "ExtractionBatch(where, params) objects, or SQL predicates as strings."
    )


class CheckpointNotJsonError(SourceError):
    error_class = "AUTOCDC_EXTRACT_CHECKPOINT_NOT_JSON"
    template = (
        "The checkpoint of extraction source `{source}` cannot be stored: {problem}. A "
        "cursor's accumulator is made of JSON values (dict with string keys, list, str, int, "
        "float, bool, None) and Decimal: convert the rest, e.g. a datetime to its ISO text."
    )


class BatchFailedError(SourceError):
    error_class = "AUTOCDC_EXTRACT_BATCH_FAILED"
    template = (
        "Batch {batch} of {batches} of extraction source `{source}` (WHERE {where}) failed "
        "{attempts} times; the last error: {error}. Nothing was applied and the checkpoint "
        "is kept, so the next run reads these rows again: fix the cause, then run again "
        "(option `retries`, 1 to 5, retries a failed query)."
    )


class PlanFailedError(BatchFailedError):
    """A query the run's batches depend on (a ``limit``'s edge) failed for good: the run
    cannot know what to read, so it reads nothing. A kind of failed batch (``except
    BatchFailedError`` catches it): the run failed for the database's sake, and the
    checkpoint stands."""

    error_class = "AUTOCDC_EXTRACT_PLAN_FAILED"
    template = (
        "The {query} of extraction source `{source}` (WHERE {where}) failed {attempts} "
        "times, before any batch was read; the last error: {error}. Nothing was applied and "
        "the checkpoint is kept, so the next run reads these rows: fix the cause (a timeout: "
        "an index on the column, or a longer statement timeout for the reading role), then "
        "run again (option `retries`, 1 to 5, retries a failed query)."
    )


class SourceLockedError(SourceError):
    """Another run reads the source (see :mod:`autocdc.pipelines.execute.lock`)."""

    error_class = "AUTOCDC_EXTRACT_LOCKED"
    template = (
        "Extraction source `{source}` is being read by another run: host {host}, pid {pid}, "
        "since {since} ({ago} ago), holding {path}. Wait for that run to end, or stop it. If "
        "it died, its claim expires {expiry:g} s after its last heartbeat ({heartbeat_ago} "
        "ago), and at once on its own host when its process is gone; then run again."
    )


class ExtractionChangedError(SourceError):
    error_class = "AUTOCDC_EXTRACT_DEFINITION_CHANGED"
    template = (
        "Flow `{flow}` holds a checkpoint of extraction source `{source}` taken with "
        "{stored}, but the source now declares {declared}, under which that checkpoint means "
        "something else. Restore the declaration, or start the flow over: "
        "`autocdc run --full-refresh {dataset}` reads the table anew."
    )


class DebeziumTopicsError(SourceError):
    error_class = "AUTOCDC_DEBEZIUM_TOPICS"
    template = (
        "A Debezium Kafka source reads either `topics` (a list of names) or `topic_pattern` "
        "(a Java regex), exactly one of them; got topics={topics}, topic_pattern={pattern}."
    )


class KafkaUnreachableError(SourceError):
    error_class = "AUTOCDC_KAFKA_UNREACHABLE"
    template = (
        "No Kafka broker answered at {servers} within {seconds:g} s ({reason}). Check the "
        "bootstrap servers (host:port, comma-separated) and that the broker is running."
    )


class DebeziumSchemaError(SourceError):
    error_class = "AUTOCDC_DEBEZIUM_SCHEMA"
    template = (
        "The row schema of the Debezium events in {topics} cannot be taken from them: "
        "{problem}. Declare it with `row_schema` (SQL: SCHEMA (...)), or have the connector "
        "write schemas (value.converter.schemas.enable=true, JsonConverter's default)."
    )


class DebeziumSchemaChangedError(SourceError):
    error_class = "AUTOCDC_DEBEZIUM_SCHEMA_CHANGED"
    template = (
        "Events of {table} carry columns the source's schema does not have ({columns}; the "
        "schema was taken from the events when the run began): nothing of this micro-batch "
        "was applied. Run "
        "the pipeline again: the source takes the new columns, and the target gains them."
    )


class KafkaTopicNotFoundError(SourceError):
    error_class = "AUTOCDC_KAFKA_TOPIC_NOT_FOUND"
    template = (
        "Topic(s) {topics} are not on the Kafka broker at {servers} (it has: {known}). Check "
        "the names (Debezium's are <topic.prefix>.<schema or database>.<table>), or start "
        "the connector first: it creates its topics with its snapshot."
    )


class KafkaSecretError(SourceError):
    error_class = "AUTOCDC_KAFKA_SECRET"
    template = "Kafka option `{option}` takes a secret from {what}, which {problem}. {fix}"


class KafkaAuthenticationError(SourceError):
    """The broker refused the credentials of the source's options: nothing was read."""

    error_class = "AUTOCDC_KAFKA_AUTHENTICATION"
    template = (
        "The Kafka broker at {servers} refused the credentials of user {user!r} "
        "({mechanism}): {reason}. Nothing was read. Check the username and password in "
        "`kafka.sasl.jaas.config` (and the variable or file its ${{env:...}} or ${{file:...}} "
        "names), `kafka.sasl.mechanism`, and that the user exists on the broker."
    )


class KafkaTlsError(SourceError):
    """The TLS handshake failed: the broker's certificate is not trusted, or names
    another host."""

    error_class = "AUTOCDC_KAFKA_TLS"
    template = (
        "The TLS connection to the Kafka broker at {servers} failed: {reason}. Nothing was "
        "read. Check `kafka.ssl.truststore.*` (it must hold the certificate of the CA that "
        "signed the broker's) and that the broker's certificate names the host you connect "
        "to (or set `kafka.ssl.endpoint.identification.algorithm` to '' to skip that check)."
    )
