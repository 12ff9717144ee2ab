"""Declare: read a project's definitions into datasets and flows.

``project`` reads ``spark-pipeline.yml``; ``registry`` collects the Python definitions
(``pyspark.pipelines`` or ``autocdc.pipelines``) and ``sql`` parses the SQL files into the
same registry; ``scaffold`` writes a sample project (``autocdc init``). Nothing here starts
a query: the run (:mod:`autocdc.pipelines.execute`) resolves what was declared and runs it.
"""
