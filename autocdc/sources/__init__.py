"""Change sources: helpers that turn what a capture tool emits into change rows that an
AutoCdcFlow applies (the BigQuery CDC shape: row columns, ``_CHANGE_TYPE``,
``_CHANGE_SEQUENCE_NUMBER``)."""
