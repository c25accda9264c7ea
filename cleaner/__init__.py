"""kafka-cleaner: Apache Kafka's log cleaner (log compaction), byte-compatible with Kafka.

The package follows the data: ``records`` (the wire/disk format, knows nothing of files)
-> ``storage`` (segments, indexes, partition directories, checkpoints) -> ``engine``
(offset map, cleaning round, cleaner manager, cleaner threads).
"""

__version__ = "0.1.0"
