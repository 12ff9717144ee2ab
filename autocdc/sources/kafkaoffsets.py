"""How far a streaming query's Kafka offsets are behind its topics' ends, asked of the
broker directly (librdkafka through ``confluent-kafka``): ``autocdc status`` starts no
Spark, and a run asks after every micro-batch, so this must cost milliseconds.

The offsets are those Spark's checkpoint records for a Kafka source: per topic, per
partition (as text), the next offset to read. A partition the checkpoint does not name yet
(a new partition, a new topic of a pattern) is behind from its earliest offset.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

TIMEOUT_SECONDS = 5.0
# The oldest record waiting is looked up per lagging partition; a topic with hundreds of
# partitions is sampled, so that status stays quick.
AGE_SAMPLE = 64


@dataclass(frozen=True)
class Behind:
    """Records not consumed yet, and the age of the oldest of them (its Kafka timestamp:
    Debezium's connectors stamp a record with the source's commit time)."""

    records: int
    oldest_age_seconds: float | None


def _consumer(servers: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "autocdc-lag",  # never joined or committed: offsets are assigned
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "socket.timeout.ms": int(TIMEOUT_SECONDS * 1000),
            "log_level": 0,  # an unreachable broker is reported as an unknown lag, not logs
        }
    )


def behind(
    servers: str,
    consumed: dict[str, dict[str, int]] | None,
    topics: list[str] | None,
    pattern: str | None,
) -> Behind | None:
    """How far ``consumed`` is behind the ends of ``topics`` (or of the topics matching
    the Java regex ``pattern``, as Spark subscribes); None when the broker cannot tell."""
    consumer = _consumer(servers)
    try:
        metadata = consumer.list_topics(timeout=TIMEOUT_SECONDS)
        names = topics or [t for t in metadata.topics if pattern and re.fullmatch(pattern, t)]
        records, waiting = 0, []
        for topic in names:
            found = metadata.topics.get(topic)
            for partition in sorted(found.partitions) if found else []:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=TIMEOUT_SECONDS
                )
                start = max(low, (consumed or {}).get(topic, {}).get(str(partition), low))
                if high > start:
                    records += high - start
                    waiting.append(TopicPartition(topic, partition, start))
        return Behind(records, _oldest_age(consumer, waiting[:AGE_SAMPLE]))
    except KafkaException:
        return None
    finally:
        consumer.close()


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
