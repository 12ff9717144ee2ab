"""What autocdc asks a Kafka broker directly (librdkafka through ``confluent-kafka``), never
through Spark: how far a streaming query's offsets are behind its topics' ends (``autocdc
status`` starts no Spark, and a run asks after every micro-batch, so this must cost
milliseconds), and the newest records of the topics (a Debezium source takes its row
schema from them when the run begins).

Offsets are those Spark's checkpoint records for a Kafka source: per topic, per partition
(as text), the next offset to read. A partition the checkpoint does not name yet (a new
partition, a new topic of a pattern) is behind from its earliest offset.

A secured broker is reached with ``client``: librdkafka's settings that
:func:`autocdc.sources.kafkaclient.config` made of the source's Spark options. A broker
that refuses the credentials or the TLS handshake is an error saying so at once (when the
run begins, before anything is read), not a timeout.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ClusterMetadata

from autocdc.sources.errors import (
    KafkaAuthenticationError,
    KafkaTlsError,
    KafkaTopicNotFoundError,
    KafkaUnreachableError,
)

TIMEOUT_SECONDS = 5.0
POLL_SECONDS = 0.25  # how often a refused handshake is looked for while waiting
_REFUSED = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
# The oldest record waiting is looked up per lagging partition; a topic with hundreds of
# partitions is sampled, so that status stays quick.
AGE_SAMPLE = 64


@dataclass(frozen=True)
class Behind:
    """Records not consumed yet, and the age of the oldest of them (its Kafka timestamp:
    Debezium's connectors stamp a record with the source's commit time)."""

    records: int
    oldest_age_seconds: float | None


class _Client:
    """A consumer that never joins a group, and the handshake errors it met."""

    def __init__(self, servers: str, client: Mapping[str, str] | None) -> None:
        self.servers, self.client = servers, dict(client or {})
        self.errors: list[KafkaError] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": servers,
                "group.id": "autocdc",  # never joined or committed: partitions are assigned
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "socket.timeout.ms": int(TIMEOUT_SECONDS * 1000),
                "log_level": 0,  # an unreachable broker is reported by the caller, not logged
                "error_cb": self.errors.append,
                **self.client,
            }
        )

    def refused(self) -> Exception | None:
        """The error for a broker that refused the credentials or the handshake."""
        for error in self.errors:
            reason = error.str()
            if error.code() in _REFUSED:
                mechanism = self.client.get("sasl.mechanism", "?")
                user = self.client.get("sasl.username")
                return KafkaAuthenticationError(
                    servers=self.servers, user=user, mechanism=mechanism, reason=reason
                )
            if error.code() == KafkaError._SSL:
                return KafkaTlsError(servers=self.servers, reason=reason)
        return None

    def metadata(self) -> ClusterMetadata:
        """Every topic's metadata; a refused handshake is raised as soon as it is seen."""
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while True:
            try:
                return self.consumer.list_topics(timeout=POLL_SECONDS)
            except KafkaException:
                self.consumer.poll(0)  # serves the error callback (nothing is assigned yet)
                refused = self.refused()
                if refused is not None:
                    raise refused from None
                if time.monotonic() >= deadline:
                    raise

    def close(self) -> None:
        self.consumer.close()


def _ranges(
    client: _Client, topics: list[str] | None, pattern: str | None
) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition of ``topics`` (or of the topics matching the Java regex ``pattern``,
    as Spark subscribes) with its earliest and end offsets."""
    consumer = client.consumer
    metadata = client.metadata()
    names = topics or [t for t in metadata.topics if pattern and re.fullmatch(pattern, t)]
    found = {}
    for topic in names:
        described = metadata.topics.get(topic)
        for partition in sorted(described.partitions) if described else []:
            found[topic, partition] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=TIMEOUT_SECONDS
            )
    return found


def behind(
    servers: str,
    consumed: dict[str, dict[str, int]] | None,
    topics: list[str] | None,
    pattern: str | None,
    client: Mapping[str, str] | None = None,
) -> Behind | None:
    """How far ``consumed`` is behind the ends of the topics; None when the broker cannot
    tell (a lag is reported as unknown, never as an error)."""
    asking = _Client(servers, client)
    try:
        records, waiting = 0, []
        for (topic, partition), (low, high) in _ranges(asking, topics, pattern).items():
            start = max(low, (consumed or {}).get(topic, {}).get(str(partition), low))
            if high > start:
                records += high - start
                waiting.append(TopicPartition(topic, partition, start))
        return Behind(records, _oldest_age(asking.consumer, waiting[:AGE_SAMPLE]))
    except (KafkaException, KafkaAuthenticationError, KafkaTlsError):
        return None
    finally:
        asking.close()


def _oldest_age(consumer: Consumer, firsts: list[TopicPartition]) -> float | None:
    """Seconds since the oldest timestamp among the first waiting record of each
    partition in ``firsts``; None when none arrives within the timeout."""
    if not firsts:
        return None
    consumer.assign(firsts)
    stamps: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while len(stamps) < len(firsts) and time.monotonic() < deadline:
        for message in consumer.consume(len(firsts), timeout=0.5):
            kind, millis = message.timestamp()
            if message.error() is None and kind and millis > 0:
                stamps.setdefault((message.topic(), message.partition()), millis)
    if not stamps:
        return None
    return max(0.0, time.time() - min(stamps.values()) / 1000)


def _unreachable(servers: str, error: KafkaException) -> KafkaUnreachableError:
    return KafkaUnreachableError(servers=servers, seconds=TIMEOUT_SECONDS, reason=str(error))


def check_topics(
    servers: str, topics: list[str] | None, client: Mapping[str, str] | None = None
) -> None:
    """Refuse a broker that does not answer or refuses the credentials, and named
    ``topics`` it does not have (asking for all topics' metadata, which never creates one)."""
    asking = _Client(servers, client)
    try:
        found = asking.metadata().topics
    except KafkaException as error:
        raise _unreachable(servers, error) from None
    finally:
        asking.close()
    missing = [t for t in topics or [] if t not in found]
    if missing:
        known = sorted(t for t in found if not t.startswith("_"))
        raise KafkaTopicNotFoundError(topics=missing, servers=servers, known=known or "none")


def newest(
    servers: str,
    topics: list[str] | None,
    pattern: str | None,
    per_partition: int,
    client: Mapping[str, str] | None = None,
) -> list[bytes | None]:
    """The values of the newest ``per_partition`` records of each partition, oldest first
    within a partition; a broker that does not answer is an error that says so."""
    asking = _Client(servers, client)
    consumer = asking.consumer
    try:
        ends, starts = {}, []
        for (topic, partition), (low, high) in _ranges(asking, topics, pattern).items():
            if high > low:
                ends[topic, partition] = high
                starts.append(TopicPartition(topic, partition, max(low, high - per_partition)))
        read: dict[tuple[str, int], list[bytes | None]] = {key: [] for key in ends}
        reached: set[tuple[str, int]] = set()
        consumer.assign(starts)
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while len(reached) < len(ends) and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    continue
                key = (message.topic(), message.partition())
                read[key].append(message.value())
                if message.offset() + 1 >= ends[key]:
                    reached.add(key)
        return [value for values in read.values() for value in values]
    except KafkaException as error:
        raise _unreachable(servers, error) from None
    finally:
        asking.close()


def retained(
    servers: str,
    topics: list[str] | None,
    pattern: str | None,
    client: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition of the topics with its earliest retained offset and its end: what a
    replay may read from. A broker that does not answer is an error that says so."""
    asking = _Client(servers, client)
    try:
        return _ranges(asking, topics, pattern)
    except KafkaException as error:
        raise _unreachable(servers, error) from None
    finally:
        asking.close()


def at_time(
    servers: str,
    ranges: Mapping[tuple[str, int], tuple[int, int]],
    millis: int,
    client: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], int]:
    """Per partition of ``ranges`` (as :func:`retained` gives them), the offset of its
    first record stamped at or after ``millis``; its end when it has none."""
    asking = _Client(servers, client)
    try:
        asked = [TopicPartition(t, p, millis) for t, p in ranges]
        found = asking.consumer.offsets_for_times(asked, timeout=TIMEOUT_SECONDS)
    except KafkaException as error:
        raise _unreachable(servers, error) from None
    finally:
        asking.close()
    return {
        (tp.topic, tp.partition): tp.offset if tp.offset >= 0 else ranges[tp.topic, tp.partition][1]
        for tp in found
    }
