"""The engine: one batch of changes in, order-independent SCD type 1 or 2 out.

The modules read like the data flow: spec -> fit (against the stored tables) -> stage
(validate) -> scd1/scd2 (reconcile with the state table: a plan) -> quarantine -> commit
(redo, the target MERGE as the commit point, the state) -> metrics; flow chains them, gc
compacts the state, tables and session hold the Delta plumbing. Its
public API is re-exported by :mod:`autocdc`; the pipeline runner uses only that.
"""
