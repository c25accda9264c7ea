"""The ``spark-submit`` entry point (a ``SparkApplication``'s ``mainApplicationFile``)::

    spark-submit --master k8s://... local:///opt/kafka-cleaner/submit.py compact /data ... --output /out

Its arguments are those of ``kafka-cleaner spark``; the jobs use the session spark-submit
configured (master, executors, ``spark.*`` settings).
"""

from __future__ import annotations

from cleaner.spark.cli import spark_group


def main() -> None:
    spark_group(prog_name="kafka-cleaner spark")


if __name__ == "__main__":
    main()
