"""Run: the declared datasets resolved and run in dependency order, under the run lock.

``graph`` checks every flow and orders the datasets before anything runs; ``runner`` runs
streaming tables (Structured Streaming, ``foreachBatch`` into the engine), materialized
views and snapshot flows; ``extraction`` runs the flows that read a database (lease, read,
apply, checkpoint, with ``checkpoint`` its file). ``lock`` holds one run at a time,
``interrupt`` turns Ctrl-C into one line, ``position`` says where each flow stands and
``progress`` shows it while the run goes on. ``eventlog`` is the log the run writes, an
event per commit: its schema is a contract with the operations that read it back.
"""
