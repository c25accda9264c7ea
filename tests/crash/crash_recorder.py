"""Record the file operations an operation performs, and build every directory a crash could leave.

The approach of ALICE and CrashMonkey, in-process: ``Recorder`` wraps the functions of the
durable-file layer (``cleaner.storage.files``: every fsync, directory fsync, rename, unlink
and file write of the project goes through it) and, after each call, takes an image of the
watched tree: each directory's names and the inode they point to, and each inode's bytes.
Writes that do not go through the layer (a segment's appends, held open for speed) show up
in the next image, so nothing is missed; they are only attributed to the next step.

``crash_states`` then builds, for every prefix of the recorded steps, the trees a crash
right after that step could leave, under one of two persistence models:

- ``ORDERED``: names reach the disk in the order they were changed (a journaling file
  system such as ext4 or XFS, the assumption Kafka's own swap protocol makes), so any
  prefix of the name changes since a directory's last fsync may be there;
- ``REORDERED``: the POSIX minimum (and btrfs, per ALICE): changes to a directory's names
  since its last fsync reach the disk in any order, each step atomic, a step never before an
  earlier one that touched the same name.

In both, a directory fsync makes every earlier name change in that directory durable, an
fsync of a file makes its bytes durable, and the bytes of a file not fsynced since they
were written may be lost (the file is then as of its last fsync, or empty if it never was).
Each state is built twice: with every file's bytes as written, and with only the durable
bytes. States are exact (no sampling); ``REORDERED`` enumerates every closed set of steps
when a window holds at most ``EXHAUSTIVE_WINDOW`` steps, and beyond that a bounded family
(every prefix, every step alone with what it depends on, every step left out with what
depends on it).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cleaner.storage import files

EXHAUSTIVE_WINDOW = 10
IGNORED = {".lock"}
"""The log dir's lock file: created and flocked outside the layer, never read by start-up."""

Image = dict[str, dict[str, int]]
"""Directory (relative to the root, "" for the root) -> file name -> inode identity."""


class Model(enum.Enum):
    ORDERED = "ordered"
    REORDERED = "reordered"


@dataclass
class Step:
    """One call to the durable-file layer and the tree right after it."""

    number: int
    call: str
    target: str
    names: Image
    contents: dict[int, bytes]
    synced_file: int | None = None
    """Inode identity made durable (fsync_file)."""
    synced_dir: str | None = None
    """Directory made durable (fsync_dir)."""


@dataclass
class Recording:
    root: Path
    steps: list[Step] = field(default_factory=list)
    """``steps[0]`` is the tree before the operation (all of it durable)."""

    def describe(self, k: int) -> str:
        return "before the operation" if k == 0 else f"after step {k} ({self.steps[k].call} {self.steps[k].target})"


class Recorder:
    """Wraps ``cleaner.storage.files`` while active; ``recording`` holds the steps."""

    WRAPPED = (
        "fsync_file",
        "fsync_dir",
        "rename",
        "link",
        "remove",
        "truncate",
        "write_file",
        "atomic_write",
        "set_mtime_ms",
    )

    def __init__(
        self,
        root: str | os.PathLike[str],
        durable: Iterable[str | os.PathLike[str]] = (),
        versions: Iterable[tuple[object, str]] = (),
    ) -> None:
        self.recording = Recording(Path(root).resolve())
        self._versions = list(versions)
        """Methods (owner, name) whose return leaves a version of the log the operation
        means to pass through (``Log.replace_segments``: a clean swaps group after group):
        recorded as a ``version`` step."""
        self._durable_roots = [Path(d).resolve() for d in durable]
        """Trees outside ``root`` whose files are durable and may be linked in (staged
        segments): imaged too, so their inodes start with their bytes durable."""
        self._identity: dict[int, int] = {}
        self._next_identity = 1
        self._live: set[int] = set()

    def _image(self) -> tuple[Image, dict[int, bytes]]:
        names: Image = {}
        contents: dict[int, bytes] = {}
        seen: set[int] = set()
        walks = [os.walk(self.recording.root), *(os.walk(d) for d in self._durable_roots)]
        for dirpath, _, filenames in itertools.chain(*walks):
            rel = os.path.relpath(dirpath, self.recording.root)
            entries = names.setdefault("" if rel == "." else rel, {})
            for name in filenames:
                if name in IGNORED:
                    continue
                path = os.path.join(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    ino = os.stat(path, follow_symlinks=False).st_ino
                    if ino not in self._identity or (ino not in self._live and ino not in seen):
                        self._identity[ino] = self._next_identity  # new file, or a reused inode number
                        self._next_identity += 1
                    ident = self._identity[ino]
                    seen.add(ino)
                    entries[name] = ident
                    if ident not in contents:
                        with open(path, "rb") as f:
                            contents[ident] = f.read()
        self._live = seen
        return names, contents

    def _record(self, call: str, target: object, synced_ino: int | None = None, synced_dir: str | None = None) -> None:
        names, contents = self._image()
        synced_file = self._identity.get(synced_ino) if synced_ino is not None else None
        self.recording.steps.append(
            Step(len(self.recording.steps), call, str(target), names, contents, synced_file, synced_dir)
        )

    def _wrap(self, name: str, real: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            target = args[0] if args else ""
            ino = None
            if name == "fsync_file":
                ino = (os.fstat(target) if isinstance(target, int) else os.stat(target)).st_ino
                if isinstance(target, int):
                    target = os.readlink(f"/proc/self/fd/{target}")
            result = real(*args, **kwargs)
            synced_dir = None
            if name == "fsync_dir":
                rel = os.path.relpath(os.path.abspath(target), self.recording.root)
                synced_dir = "" if rel == "." else rel
            self._record(name, target, ino, synced_dir)
            return result

        return wrapper

    @contextlib.contextmanager
    def active(self) -> Iterator[Recording]:
        self._record("start", self.recording.root)
        with pytest.MonkeyPatch.context() as m:
            for name in self.WRAPPED:
                m.setattr(files, name, self._wrap(name, getattr(files, name)))
            for owner, name in self._versions:
                m.setattr(owner, name, self._mark(name, getattr(owner, name)))
            yield self.recording
        self._record("version", "the operation returned")

    def _mark(self, name: str, real: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            result = real(*args, **kwargs)
            self._record("version", f"{name} returned")
            return result

        return wrapper


def record(
    root: str | os.PathLike[str],
    operation: Callable[[], object],
    durable: Iterable[str | os.PathLike[str]] = (),
    versions: Iterable[tuple[object, str]] = (),
) -> Recording:
    """Run ``operation`` with the durable-file layer recorded; exceptions propagate."""
    recorder = Recorder(root, durable, versions)
    with recorder.active() as recording:
        operation()
    return recording


@dataclass(frozen=True)
class CrashState:
    prefix: int
    """The crash comes right after ``steps[prefix]``."""
    variant: str
    tree: dict[str, dict[str, bytes]]
    """Directory -> file name -> bytes, as the file system shows it after the crash."""
    minimal: bool = False
    """Only what was made durable: names as of each directory's last fsync, bytes as of
    each file's last fsync."""


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int | None]:
    out: dict[str, int | None] = {n: None for n in before if n not in after}
    out.update({n: i for n, i in after.items() if before.get(n) != i})
    return out


def _closed_subsets(windows: list[dict[str, int | None]]) -> Iterator[tuple[int, ...]]:
    """Sets of step indexes into ``windows`` that contain, with each step, every earlier
    step touching one of its names."""
    n = len(windows)
    deps = [{j for j in range(i) if windows[j].keys() & windows[i].keys()} for i in range(n)]

    def closed(chosen: set[int]) -> bool:
        return all(deps[i] <= chosen for i in chosen)

    if n <= EXHAUSTIVE_WINDOW:
        for r in range(n + 1):
            for combo in itertools.combinations(range(n), r):
                if closed(set(combo)):
                    yield combo
        return
    family: set[tuple[int, ...]] = {tuple(range(k)) for k in range(n + 1)}
    for i in range(n):
        with_deps = {i}
        frontier = [i]
        while frontier:
            for d in deps[frontier.pop()]:
                if d not in with_deps:
                    with_deps.add(d)
                    frontier.append(d)
        family.add(tuple(sorted(with_deps)))
        dependents = {i} | {j for j in range(n) if i in deps[j]}
        grew = True
        while grew:
            more = {j for j in range(n) if deps[j] & dependents} - dependents
            grew = bool(more)
            dependents |= more
        family.add(tuple(j for j in range(n) if j not in dependents))
    yield from sorted(family, key=lambda c: (len(c), c))


def _name_states(recording: Recording, k: int, directory: str, model: Model) -> list[dict[str, int]]:
    """The name maps ``directory`` may have on disk after a crash right after step ``k``."""
    steps = recording.steps
    durable_at = max((s.number for s in steps[1 : k + 1] if s.synced_dir == directory), default=0)
    base = steps[durable_at].names.get(directory, {})
    window = [
        _delta(steps[i - 1].names.get(directory, {}), steps[i].names.get(directory, {}))
        for i in range(durable_at + 1, k + 1)
    ]
    window = [d for d in window if d]
    if model is Model.ORDERED:
        subsets: Iterator[tuple[int, ...]] = (tuple(range(j)) for j in range(len(window) + 1))
    else:
        subsets = _closed_subsets(window)
    out, seen = [], set()
    for chosen in subsets:
        names = dict(base)
        for i in chosen:
            for name, ident in window[i].items():
                if ident is None:
                    names.pop(name, None)
                else:
                    names[name] = ident
        key = tuple(sorted(names.items()))
        if key not in seen:
            seen.add(key)
            out.append(names)
    return out


def crash_states(
    recording: Recording, model: Model, directories: list[str], prefixes: Iterable[int] | None = None
) -> Iterator[CrashState]:
    """Every tree a crash could leave, for every prefix of the recording, restricted to
    ``directories`` (relative to the root). Directories vary together only along the
    product of their states, capped by keeping the others as written."""
    steps = recording.steps
    durable_bytes: dict[int, bytes] = dict(steps[0].contents)
    written_bytes: dict[int, bytes] = {}
    wanted = set(range(len(steps)) if prefixes is None else prefixes)
    for k in range(len(steps)):
        step = steps[k]
        written_bytes.update(step.contents)
        if step.synced_file is not None:
            durable_bytes[step.synced_file] = step.contents.get(step.synced_file, b"")
        if k not in wanted:
            continue
        per_dir = [_name_states(recording, k, d, model) for d in directories]
        combos = list(itertools.product(*per_dir))
        if len(combos) > 2000:
            combos = [
                tuple(states[0] if j != i else s for j, states in enumerate(per_dir))
                for i, states in enumerate(per_dir)
                for s in states
            ]
        for n, combo in enumerate(combos):
            for variant in ("written", "durable"):
                tree = {}
                for d, names in zip(directories, combo, strict=True):
                    if variant == "written":
                        tree[d] = {n: written_bytes[i] for n, i in names.items()}
                    else:
                        tree[d] = {n: durable_bytes.get(i, b"") for n, i in names.items()}
                yield CrashState(k, variant, tree, minimal=n == 0 and variant == "durable")
