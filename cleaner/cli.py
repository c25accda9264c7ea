"""The ``kafka-cleaner`` command.

Each subcommand lives with the code it drives (``cleaner.dump``, ``cleaner.generate``, ...);
this module only assembles them, lazily: a subcommand's module (and numpy, the engine, the
sidecar, Spark's bindings) is imported only when that subcommand runs, so ``--help`` and
every command start no slower than they must. Exit codes: 0 ok, 2 usage or policy error, 3
some partition uncleanable, 4 log dir locked by a broker, 130/143 interrupted.
"""

from __future__ import annotations

import gc
import importlib

import click

from cleaner import __version__

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "clean": ("cleaner.commands:clean_command", "Clean Kafka log dirs until no partition is eligible, then exit."),
    "diverged": (
        "cleaner.manifestations:diverged_command",
        "Which of the replication race's four manifestations a replica has, against one in sync.",
    ),
    "demo": ("cleaner.demo:demo_command", "Generate a realistic Kafka log dir and clean it, showing before and after."),
    "dump": (
        "cleaner.dump:dump",
        "Print the contents of a Kafka log file, partition directory or log dir (like kafka-dump-log.sh).",
    ),
    "generate": (
        "cleaner.generate:generate_command",
        "Write a realistic Kafka broker log dir into DATA_DIR (empty or absent).",
    ),
    "refetch": (
        "cleaner.refetch:refetch_command",
        "Make a stopped broker fetch a diverged partition again from its leader.",
    ),
    "run": ("cleaner.commands:run_command", "Run the cleaner threads (with backoff) until SIGTERM/SIGINT."),
    "sidecar": ("cleaner.sidecar.command:sidecar_command", "Run next to a Kafka broker: observe, compact or stage."),
    "spark": ("cleaner.spark.cli:spark_group", "Scale-out on Apache Spark: fleet reports, many partitions, huge ones."),
    "stage": ("cleaner.sidecar.stage_cli:stage_group", "Stage mode's staged sets: status, commit, discard."),
    "status": ("cleaner.commands:status_command", "Per partition: cleanable ratio, eligible or why not."),
    "where": ("cleaner.where:where_command", "Every record of one key still on disk, and when each will be gone."),
}
"""Name -> (where the command is, the line ``kafka-cleaner --help`` shows for it)."""


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only to run it (or show its own help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module, _, attribute = SUBCOMMANDS[cmd_name][0].partition(":")
        return getattr(_import_for_good(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)])


def _import_for_good(module: str) -> object:
    """Import a subcommand's module with the cyclic garbage collector paused, then move
    everything the import made out of its reach: those objects live as long as the process,
    and collecting while importing (numpy, the engine) only spends time scanning them, as
    would every later full collection. (``gc.freeze`` is what CPython documents for this.)"""
    gc.disable()
    try:
        return importlib.import_module(module)
    finally:
        gc.freeze()
        gc.enable()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kafka-cleaner")
def main() -> None:
    """Apache Kafka's log cleaner (log compaction), byte-compatible with Kafka."""


if __name__ == "__main__":  # pragma: no cover
    main()
