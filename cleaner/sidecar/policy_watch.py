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
