"""How the commands print for a person and for a pipe: tables (``--output
table|wide|tsv|json``), byte counts in binary units, and progress bars.

One rule for every command: on a terminal a table fits the screen; into a pipe or a file
nothing is ever cut (``wide``: a plain aligned table, or ``tsv``: raw numbers, one row a
line). Sizes read by a person are binary units labelled so (KiB, MiB, GiB); TSV and JSON
carry plain byte counts. Progress bars go to stderr, only on a terminal, and never pass
100%: when the work outgrows its estimate the total grows with it.

rich is imported only to draw (a table on a terminal, a progress bar): a command whose output
goes to a pipe never pays its import.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import click

FORMATS = ("table", "wide", "tsv", "json")

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def binary_bytes(n: float) -> str:
    """``n`` bytes in binary units, labelled: ``512 B``, ``1.5 KiB``, ``3.0 MiB``."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Bytes:
    """A cell holding a byte count: binary units in a table, the plain number in TSV."""

    n: int

    def __str__(self) -> str:
        return binary_bytes(self.n)


@dataclass(frozen=True)
class Duration:
    """A cell holding a duration in seconds: ``3d 4h``, ``2h 5m``, ``4m 10s`` or ``12s`` in a
    table, the plain number of seconds in TSV."""

    seconds: float

    def __str__(self) -> str:
        minutes, secs = divmod(int(self.seconds), 60)
        hours, mins = divmod(minutes, 60)
        days, hrs = divmod(hours, 24)
        if days:
            return f"{days}d {hrs}h"
        if hours:
            return f"{hours}h {mins}m"
        return f"{minutes}m {secs}s" if minutes else f"{secs}s"


Cell = str | int | float | Bytes | Duration | None


def _human(cell: Cell) -> str:
    if cell is None:
        return "-"
    if isinstance(cell, int) and not isinstance(cell, bool):
        return f"{cell:,}"
    return str(cell)


def _raw(cell: Cell) -> str:
    if cell is None:
        return ""
    if isinstance(cell, Bytes):
        return str(cell.n)
    if isinstance(cell, Duration):  # whole seconds as an integer, never 9.58511e+07
        return str(int(cell.seconds)) if float(cell.seconds).is_integer() else str(cell.seconds)
    return str(cell).replace("\t", " ").replace("\n", " ")


@dataclass(frozen=True)
class Column:
    name: str
    right: bool = False
    drop: int = 0
    """On a terminal too narrow for every column, the columns with the highest ``drop`` are
    left out first (and named under the table); 0: always shown."""


def output_option(f):  # type: ignore[no-untyped-def]
    """``--output/-o table|wide|tsv|json`` and ``--json`` (the same as ``-o json``)."""
    f = click.option("--json", "as_json", is_flag=True, help="The same as --output json.")(f)
    return click.option(
        "--output",
        "-o",
        "output",
        type=click.Choice(FORMATS),
        default=None,
        help="table (fits the terminal), wide (nothing cut; the default into a pipe or file), "
        "tsv (raw numbers, a header line), json.",
    )(f)


def resolve_format(output: str | None, as_json: bool, stream: TextIO | None = None) -> str:
    """The chosen format: ``--json`` wins, then ``--output``, else ``table`` on a terminal and
    ``wide`` anywhere else (so a pipe always gets full values)."""
    if as_json:
        return "json"
    if output is not None:
        return output
    return "table" if (stream or sys.stdout).isatty() else "wide"


def print_table(fmt: str, title: str, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> None:
    """Print rows as ``fmt`` (table, wide or tsv) on stdout."""
    if fmt == "tsv":
        click.echo("\t".join(c.name.replace(" ", "_") for c in columns))
        for row in rows:
            click.echo("\t".join(_raw(c) for c in row))
        return
    text = [[_human(c) for c in row] for row in rows]
    if fmt == "wide":
        widths = [max([len(c.name)] + [len(r[i]) for r in text]) for i, c in enumerate(columns)]

        def line(cells: Sequence[str]) -> str:
            parts = [
                cell.rjust(w) if col.right else cell.ljust(w)
                for cell, w, col in zip(cells, widths, columns, strict=True)
            ]
            return "  ".join(parts).rstrip()

        click.echo(line([c.name for c in columns]))
        for r in text:
            click.echo(line(r))
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    keep, widths = fit_columns(columns, text, console.width)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i in keep:
        c = columns[i]
        # Every value fits its column; a name wraps at its spaces, and a partition name
        # longer than the whole terminal folds: nothing is cut.
        table.add_column(c.name, justify="right" if c.right else "left", width=widths[i], overflow="fold")
    for r in text:
        table.add_row(*(r[i] for i in keep))
    console.print(table)
    left_out = [c.name for i, c in enumerate(columns) if i not in keep]
    if left_out:
        console.print(
            f"(left out to fit {console.width} columns: {', '.join(left_out)}; -o wide shows every column)",
            style="dim",
        )


_COLUMN_OVERHEAD = 3
"""What the table draws around a column's values (box.SIMPLE_HEAD without edges: one
padding on each side and a separator; the outer ones are not drawn, so this is an upper bound)."""


def fit_columns(columns: Sequence[Column], text: Sequence[Sequence[str]], width: int) -> tuple[list[int], list[int]]:
    """(the indexes of the columns shown in ``width`` characters, each column's width).

    A column is as wide as its longest value (values are never cut) or the longest word of
    its name (a name wraps at its spaces). Columns are left out, highest ``drop`` first,
    until the rest fit; if the first column's values are longer than what is left of the
    line, that one column folds its values onto more lines."""
    widths = [max([len(w) for w in c.name.split()] + [len(r[i]) for r in text]) for i, c in enumerate(columns)]
    keep = list(range(len(columns)))

    def total(indexes: list[int]) -> int:
        return sum(widths[i] + _COLUMN_OVERHEAD for i in indexes)

    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop):
        if total(keep) <= width:
            break
        keep.remove(i)
    overflow = total(keep) - width
    if overflow > 0:
        widths[keep[0]] = max(widths[keep[0]] - overflow, 8)
    return keep, widths


# ---------------------------------------------------------------------------------------
# Progress


class ByteProgress:
    """A progress bar over bytes on stderr (binary units), shown only on a terminal and
    when not switched off; ``advance`` never takes it past 100%: work beyond the estimate
    grows the total instead."""

    def __init__(self, label: str, total: int | None, *, enabled: bool = True) -> None:
        self.shown = enabled and sys.stderr.isatty()
        self.completed = 0
        self.total = total or 0
        self._progress = _rich_progress(label) if self.shown else None
        self._task = self._progress.add_task(label, total=total or None) if self._progress is not None else None

    def advance(self, n: int) -> None:
        self.completed += n
        grown = bool(self.total) and self.completed > self.total
        if grown:
            self.total = self.completed
        if self._progress is not None:
            if grown:
                self._progress.update(self._task, total=self.total)
            self._progress.advance(self._task, n)

    @contextlib.contextmanager
    def shown_while(self) -> Iterator[ByteProgress]:
        if self._progress is None:
            yield self
            return
        with self._progress:
            yield self


def _rich_progress(label: str) -> Any:
    """rich's progress bar with a speed column in binary units, on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class BinarySpeed(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{binary_bytes(speed)}/s", style="progress.data.speed")

    return Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(binary_units=True),
        BinarySpeed(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
