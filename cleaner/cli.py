"""The ``kafka-cleaner`` command.

Each subcommand lives with the code it drives (``cleaner.dump``, ``cleaner.generate``, ...);
this module only assembles them and maps errors to exit codes:
0 ok, 2 usage or policy error, 3 some partition uncleanable, 4 log dir locked by a broker.
"""

from __future__ import annotations

import click

from cleaner import __version__
from cleaner.commands import clean_command, run_command, status_command
from cleaner.demo import demo_command
from cleaner.dump import dump
from cleaner.generate import generate_command
from cleaner.sidecar.command import sidecar_command
from cleaner.sidecar.stage_cli import stage_group
from cleaner.spark.cli import spark_group


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kafka-cleaner")
def main() -> None:
    """Apache Kafka's log cleaner (log compaction), byte-compatible with Kafka."""


main.add_command(dump)
main.add_command(generate_command)
main.add_command(clean_command)
main.add_command(run_command)
main.add_command(status_command)
main.add_command(demo_command)
main.add_command(sidecar_command)
main.add_command(stage_group)
main.add_command(spark_group)


if __name__ == "__main__":  # pragma: no cover
    main()
