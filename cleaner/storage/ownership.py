"""Whose files the broker's are, and giving what kafka-cleaner creates in a log dir to the broker.

A broker runs as a uid of its own (Strimzi and Bitnami: 1001, Confluent: 1000) and opens
every file of its log dirs read-write: segments and indexes (``FileRecords.open``, the
mmapped indexes), checkpoints (rewritten through ``<file>.tmp``), the ``.lock``
(``FileLock``: ``FileChannel.open`` with CREATE, READ, WRITE). A file it cannot open that way
is an ``AccessDeniedException`` (an ``IOException``): the log dir goes offline, and a broker
whose every log dir is offline halts. Kafka itself creates its files as its own uid and group
with the mode its umask leaves of 0666 (0644 under the usual 022).

kafka-cleaner may run as another uid: the CLI as root, the sidecar as 65532 with the pod's
fsGroup (Kubernetes gives that group to every container and to the volume). Whatever it
creates in a log dir must be what the broker would have created, so:

- as the broker's uid: nothing to do, the file is created as Kafka creates it;
- as root: the file is given to the broker (``fchown`` to its uid and group) with the mode
  Kafka would give it;
- as another uid: the file gets the broker's group (a setgid directory gives it; a member
  of the group may ``fchown`` it) and is made group read-write; if it cannot get the
  broker's group, nothing is created and ``OwnershipError`` says why.

**Who the broker is.** ``Owner.of(partition_dir)``: the owner of the partition's first
segment (what the stage-mode guards compare with). ``template(directory)``, for a file about
to be created in ``directory``: the owner of the directory's ``meta.properties`` (a log dir:
its root may be a volume's mount point, owned by root) or else of the directory itself (a
partition dir, created by the broker); the mode is the reference's read-write bits, which
is what the broker's umask left (a directory's 0755 gives 0644, 0775 gives 0664), or the
mode of the file replaced.

**No window.** ``open_for_broker`` creates a new file as an unnamed ``O_TMPFILE`` inode,
gives it to the broker, and only then links it under its name: a process killed at any
instant leaves no file, or one the broker can open. Where ``O_TMPFILE`` is not supported it
creates the file under its name and gives it away at once (a kill between the two system
calls would leave the file as this process's).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass

from cleaner.errors import KafkaCleanerError

PathLike = str | os.PathLike[str]

META_PROPERTIES = "meta.properties"
_LOG_SUFFIX = ".log"
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_RW = 0o666


class OwnershipError(KafkaCleanerError):
    """A file kafka-cleaner would create (or opened) could not be given to the broker's uid or
    group: the broker could not open it read-write. A file it would have created is not."""


@dataclass(frozen=True)
class Owner:
    """The broker's uid and group: who must be able to open what kafka-cleaner creates."""

    uid: int
    gid: int

    @classmethod
    def of(cls, partition_dir: PathLike) -> Owner:
        """The owner of the partition's first segment (the directory's when it has none)."""
        with os.scandir(partition_dir) as it:
            logs = sorted(e.name for e in it if e.name.endswith(_LOG_SUFFIX) and e.is_file(follow_symlinks=False))
        st = os.stat(os.path.join(partition_dir, logs[0])) if logs else os.stat(partition_dir)
        return cls(st.st_uid, st.st_gid)


@dataclass(frozen=True)
class Template:
    """The owner and mode a file created in a log dir must have."""

    owner: Owner
    mode: int


def groups() -> set[int]:
    """The groups this process may give its files to."""
    return {os.getegid(), *os.getgroups()}


def template(directory: PathLike, *, like: PathLike | None = None) -> Template:
    """What Kafka would give a file it creates in ``directory`` (see the module docstring);
    ``like``: the file being replaced, whose mode is kept when it exists."""
    try:
        ref = os.stat(os.path.join(directory, META_PROPERTIES))
    except FileNotFoundError:
        ref = os.stat(directory)
    mode = stat.S_IMODE(ref.st_mode) & _RW
    if like is not None:
        with contextlib.suppress(FileNotFoundError):
            mode = stat.S_IMODE(os.stat(like).st_mode) & _RW
    return Template(Owner(ref.st_uid, ref.st_gid), mode | 0o600)


def make_usable_by(path: PathLike | int, owner: Owner, mode: int | None = None) -> str | None:
    """Make a file (a path or an open descriptor) readable and writable, or a directory
    writable, by the broker: Kafka opens segments and mmaps indexes read-write, and deleting
    a partition deletes everything in its directory. None when the broker can use it, else
    why not (nothing is changed then).

    A file of the owner's is left as it is. Root gives the file to the owner (and sets
    ``mode`` when given). Another uid gives it to the owner's group, as a member of it, and
    makes it group read-write (a directory: group read-write-search), from ``mode`` when given."""
    st = os.stat(path)
    if st.st_uid == owner.uid:
        return None
    if os.geteuid() == 0:
        os.chown(path, owner.uid, owner.gid)
        if mode is not None and stat.S_IMODE(os.stat(path).st_mode) != mode:
            os.chmod(path, mode)
        return None
    if st.st_gid != owner.gid and owner.gid in groups():
        os.chown(path, -1, owner.gid)
        st = os.stat(path)
    if st.st_gid != owner.gid:
        return (
            f"kafka-cleaner runs as uid {os.geteuid()}, not as the owner ({owner.uid}) of the broker's files, and the "
            f"files it writes get group {st.st_gid}, not the broker's group {owner.gid}: the broker could not open "
            "them (run it as the broker's uid, or with the broker's group, e.g. the pod's fsGroup)"
        )
    base = stat.S_IMODE(st.st_mode) if mode is None else mode
    wanted = base | (0o070 if stat.S_ISDIR(st.st_mode) else 0o060)
    if stat.S_IMODE(st.st_mode) != wanted:
        os.chmod(path, wanted)
    return None


def _give(fd: int, path: PathLike, tmpl: Template) -> None:
    refused = make_usable_by(fd, tmpl.owner, tmpl.mode)
    if refused is not None:
        raise OwnershipError(f"{os.fspath(path)}: {refused}")


def _anonymous(directory: str, flags: int) -> int | None:
    """An unnamed file in ``directory`` (``O_TMPFILE``), None where that is not supported."""
    if not _O_TMPFILE:
        return None
    try:
        return os.open(directory, _O_TMPFILE | (flags & os.O_ACCMODE), 0o600)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOTSUP):
            return None
        raise


def _link_anonymous(fd: int, directory: str, name: str) -> bool:
    """Give the unnamed file ``fd`` its name; False if the name exists. ``linkat`` with
    ``AT_SYMLINK_FOLLOW`` on ``/proc/self/fd/N`` (os.link uses ``linkat`` only when given a
    directory descriptor). Raises ``FileNotFoundError`` without /proc."""
    dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
    except FileExistsError:
        return False
    finally:
        os.close(dfd)
    return True


def open_for_broker(path: PathLike, flags: int, *, like: PathLike | None = None) -> tuple[int, bool]:
    """``os.open(path, flags | O_CREAT)`` for a file in a log dir that the broker must be
    able to open: returns the descriptor and whether this call created the file.

    As the broker's uid (or root on a root broker's files) this is a plain open. Otherwise a
    new file is created unnamed, given to the broker (``template``; ``like``: the file it will
    replace) and then linked under its name, so no instant leaves a file of this process's
    under a name; an existing file is given to the broker too where it is not already usable
    by it (a file an older kafka-cleaner left as root). Raises ``OwnershipError``, creating
    nothing, when the broker could not be given the file."""
    path = os.fspath(path)
    flags &= ~(os.O_CREAT | os.O_EXCL)
    directory = os.path.dirname(os.path.abspath(path))
    tmpl = template(directory, like=like)
    adopt = os.geteuid() != tmpl.owner.uid
    for _ in range(16):
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            pass
        else:
            if adopt:
                mode = tmpl.mode if like is not None else stat.S_IMODE(os.fstat(fd).st_mode) | 0o600
                try:
                    _give(fd, path, Template(tmpl.owner, mode))
                except BaseException:
                    os.close(fd)
                    raise
            return fd, False
        fd = _anonymous(directory, flags) if adopt else None
        if fd is not None:
            try:
                _give(fd, path, tmpl)
                linked = _link_anonymous(fd, directory, os.path.basename(path))
            except FileNotFoundError:  # no /proc: name it the other way
                os.close(fd)
            except BaseException:
                os.close(fd)
                raise
            else:
                if linked:
                    return fd, True
                os.close(fd)
                continue  # created meanwhile by another process: open that one
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, _RW)
        except FileExistsError:
            continue
        if adopt:
            try:
                _give(fd, path, tmpl)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
        return fd, True
    raise OSError(errno.EAGAIN, f"{path}: created and deleted by another process again and again")
