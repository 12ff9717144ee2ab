"""Operations: what the runs left behind, read back for people and scripts.

``overview`` answers ``autocdc status`` and ``autocdc history`` from the event log and
the tables (read without Spark by ``lake``); ``report`` gathers the status page and
``report_html`` renders it.
"""
