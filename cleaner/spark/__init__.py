"""kafka-cleaner on Apache Spark (PySpark): the engine's rules, distributed.

- ``report``: per partition what ``kafka-cleaner status`` shows, plus exact distinct keys
  and reclaimable bytes from a distributed key-hash -> latest-offset aggregation;
- ``compact``: one Spark task per partition, each running the engine unchanged;
- ``compact-large``: one huge partition, its cleaning round split into a distributed map
  build and a parallel rewrite of its segment groups.

Spark only distributes the work: every Kafka rule (retention, transactions, horizons,
grouping, re-encoding) is the engine's (``cleaner.engine``). See docs/spark.md.
"""
