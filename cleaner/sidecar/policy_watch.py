"""Reload the policy file when it changes.

The operator mounts the policy from a ConfigMap *directory*: the kubelet swaps the whole
directory through a ``..data`` symlink, so the file's inode and mtime are no reliable
signal. The content is: it is read and hashed on every poll (a few KiB).

A policy file without ``metadata.generation`` (a local file, a bare spec) gets one from a
counter of the distinct contents loaded, so ``policyGeneration`` always says which
version a report reflects.

Fields this version does not know are ignored, not errors: the file may come from an
operator one minor version newer (its CRD has fields this sidecar predates), and a sidecar
that refused it would keep the old generation for ever (the policy stuck in
``AwaitingPolicy``). They are listed in ``unknown_fields`` and logged once per distinct set
(docs/operator.md, "Version skew")."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path

from cleaner.config import Policy, parse_policy_text
from cleaner.errors import PolicyError

log = logging.getLogger("cleaner.sidecar")


class PolicyWatcher:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.policy: Policy | None = None
        self.error: str | None = None
        self._digest: bytes | None = None
        self._loaded = 0
        self.missing = False
        """The file is gone (the policy was deleted): the sidecar stops acting on it."""
        self.unknown_fields: tuple[str, ...] = ()
        """Fields of the loaded policy this version does not know (and ignores)."""
        self._unchanged: bytes | None = None
        """The last content ``changed`` found to make no difference."""

    def poll(self) -> Policy | None:
        """The new policy if the file changed and parses; None otherwise (a bad or missing
        file keeps the last good policy and sets ``error``)."""
        try:
            data = self.path.read_bytes()
        except OSError as e:
            self.error = f"{self.path}: {e.strerror or e}"
            self.missing = isinstance(e, FileNotFoundError)
            if self.missing:
                self._digest = None  # the same policy coming back is a new load
            return None
        self.missing = False
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:
            return None
        self._digest = digest
        unknown: list[str] = []
        try:
            policy = parse_policy_text(
                data.decode("utf-8", errors="replace"), source=str(self.path), unknown_fields=unknown
            )
        except PolicyError as e:
            self.error = str(e)
            return None
        self.error = None
        if tuple(unknown) != self.unknown_fields and unknown:
            log.warning("%s: ignoring fields this sidecar does not know (a newer operator?): %s",
                        self.path, ", ".join(unknown))
        self.unknown_fields = tuple(unknown)
        self._loaded += 1
        if policy.policy_generation is None:
            policy = dataclasses.replace(policy, policy_generation=self._loaded)
        self.policy = policy
        return policy

    def changed(self) -> bool:
        """Whether the file now holds another valid policy than the one loaded, or is gone:
        what the next ``poll`` would act on. Changes nothing here (``poll`` still sees the
        change); a file that does not parse is no change (the loaded policy stays in force).
        Stage mode asks it while a round runs, so a policy change aborts the round at once."""
        if self.policy is None:
            return False
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        digest = hashlib.sha256(data).digest()
        if digest in (self._digest, self._unchanged):
            return False
        try:
            new = parse_policy_text(data.decode("utf-8", errors="replace"), source=str(self.path), unknown_fields=[])
        except PolicyError:
            new = None
        if new is None or new == self.policy:  # the spec is the same (a new generation alone)
            self._unchanged = digest
            return False
        return True


class PolicyInForce:
    """The policy file as it is at this instant, for a commit: read again on every call (a few
    KiB), parsed again only when its content changed. A file that does not parse leaves the
    last good policy in force (``last_good``, then the last one read here), as the watcher
    does; a file that is gone is a deleted policy."""

    def __init__(self, path: str | Path, last_good: Policy | None = None) -> None:
        self.path = Path(path)
        self._policy = last_good
        self._digest: bytes | None = None

    def read(self) -> tuple[Policy | None, str | None]:
        """(the policy in force, None), or (None, why there is none)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None, f"the policy file {self.path} is gone (a deleted policy)"
        except OSError as e:
            return None, f"cannot read the policy file {self.path}: {e.strerror or e}"
        digest = hashlib.sha256(data).digest()
        if digest != self._digest:
            self._digest = digest
            try:
                self._policy = parse_policy_text(
                    data.decode("utf-8", errors="replace"), source=str(self.path), unknown_fields=[]
                )
            except PolicyError as e:
                log.warning("%s: %s; the last good policy stays in force", self.path, e)
        if self._policy is None:
            return None, f"the policy file {self.path} holds no valid policy"
        return self._policy, None
