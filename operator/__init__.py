"""The kopf operator for CompactionPolicy resources (import name ``compaction_operator``)."""
