"""The command starts fast (issue 13: ``--help`` within 0.15 s): a subcommand's module, and
numpy, the engine, the sidecar or Spark behind it, is imported only when that subcommand runs."""

from __future__ import annotations

import subprocess
import sys

import click

from cleaner.cli import SUBCOMMANDS, main


def test_help_imports_no_subcommand_module() -> None:
    probe = (
        "import sys\n"
        "from cleaner.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'numpy' or m.startswith(('cleaner.engine',"
        " 'cleaner.sidecar', 'cleaner.spark', 'cleaner.commands', 'cleaner.dump', 'yaml', 'rich')))\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
    for name in SUBCOMMANDS:
        assert name in done.stdout


def test_every_listed_command_is_the_command_it_names() -> None:
    ctx = click.Context(main)
    for name, (_, summary) in SUBCOMMANDS.items():
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name
        full = command.get_short_help_str(limit=1000)
        assert full.split()[0] == summary.split()[0], (name, full, summary)
