"""The Spark settings of the tests: the workers' sessions and the JVMs tests start."""

from __future__ import annotations

# The workers' sessions collect garbage with the parallel collector, not G1 (the JVM's
# default): a tiny batch (5 changes into 20 rows, warm JVM, SCD1) took 2.7 s instead of
# 3.7-3.8 s, and the JVM spent less CPU (180 s instead of 190-218 s for 30 batches); the
# non-e2e suite took 12:48 instead of 17:29 (one idle machine, one run each).
TEST_CONF = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
    # Spark's Kafka sink pools its producers (10 minutes by default), and a pooled producer
    # whose broker stopped reconnects to the broker's port every second, sending a Kafka
    # request. A process that listens on that port later takes it for its client: a Spark
    # Python worker's callback socket failed a run in CI with "Python worker failed to
    # connect back" (its cause: "Authentication failed"). Idle producers close within
    # PRODUCERS_CLOSED_WITHIN seconds, and a test's broker stops after that.
    "spark.kafka.producer.cache.timeout": "1s",
    "spark.kafka.producer.cache.evictorThreadRunInterval": "1s",
}
PRODUCERS_CLOSED_WITHIN = 2.5
# A JVM a test starts in a subprocess lives a minute or two: the client compiler alone and
# the serial collector spend about a third less CPU on its start and first batches than the
# server compiler's and G1's threads (measured: 142 -> 95 s of CPU for one start and four
# applies), which on 2 cores shared by both workers and their subprocesses is wall time.
# Not for the workers' own sessions, which live through hundreds of batches: there the
# server compiler pays off (test_scd1.py: 411 s of CPU with it, over 450 s without).
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SUBPROCESS_CONF = {**TEST_CONF, "spark.driver.extraJavaOptions": JVM_OPTIONS}
# A pipeline project's own configuration, for the runs tests start as processes.
SMALL_SPARK = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
}
