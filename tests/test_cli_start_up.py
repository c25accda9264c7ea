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


def test_a_command_into_a_pipe_imports_no_rich(tmp_path) -> None:
    """rich draws tables and progress bars on a terminal; into a pipe nothing needs it."""
    from cleaner.generate import GeneratorConfig, generate

    generate(tmp_path / "logs", GeneratorConfig(topics=1, partitions=1, records=200))
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: compact\ntopics:\n  - match: '.*'\n    cleanupPolicy: compact\n")
    probe = (
        "import sys\n"
        "from cleaner.cli import main\n"
        f"for args in (['status', {str(tmp_path / 'logs')!r}, '--policy', {str(policy)!r}],\n"
        f"             ['clean', {str(tmp_path / 'logs')!r}, '--policy', {str(policy)!r}]):\n"
        "    try:\n        main(args)\n    except SystemExit as e:\n        assert e.code == 0, e.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
