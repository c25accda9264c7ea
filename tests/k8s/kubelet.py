"""The kubelet's part that kwok does not play: kwok marks pods Running but runs no container,
so a test runs the injected sidecar container itself, as a kubelet would, with the pod's
volumes mapped to directories of the test:

* the sidecar process is started from the container the operator injected (its ``command``
  and ``args``, ``$(POD_NAME)`` expanded from its ``env``), with the pod's mount paths mapped to
  directories of the test and ``--listen 0.0.0.0:PORT`` narrowed to loopback (the broker pod
  uses the host network, where kwok gives it the node's address, 127.0.0.1);
* the policy volume is laid out like a kubelet's ConfigMap volume (``policy.yaml`` a symlink
  into ``..data``, a symlink swapped atomically to a new directory on every update), filled
  from the ConfigMap the operator wrote, and synced when the test says the kubelet would.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from compaction_operator.injection import find_sidecar
from operator_helpers import wait_for

KAFKA_CLEANER = pathlib.Path(sys.executable).with_name("kafka-cleaner")
#: Generous: a loaded 2-core CI machine runs this next to other tests.
TIMEOUT = 30.0


class ConfigMapVolume:
    """A ConfigMap volume as the kubelet's atomic writer lays it out: each item is a symlink
    ``<path> -> ..data/<path>``, ``..data`` a symlink to a timestamped directory, and an update
    writes a new directory and renames a new ``..data`` over the old one (so the file the
    sidecar reads changes all at once, and its inode and mtime say nothing)."""

    def __init__(self, root: pathlib.Path, volume: Mapping[str, Any]) -> None:
        self.root = root
        self.source = volume["configMap"]
        self.version = 0
        self.data: dict[str, str] | None = None
        root.mkdir(parents=True)

    def sync(self, configmap: Mapping[str, Any]) -> bool:
        """Project ``configmap`` (the items of the volume) if it changed; whether it did."""
        assert configmap["metadata"]["name"] == self.source["name"]
        items = self.source.get("items") or [{"key": k, "path": k} for k in configmap.get("data") or {}]
        data = {item["path"]: configmap["data"][item["key"]] for item in items}
        if data == self.data:
            return False
        self.version += 1
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S")
        new = self.root / f"..{stamp}.{self.version:04d}"
        new.mkdir()
        for path, text in data.items():
            (new / path).write_text(text)
        link = self.root / "..data"
        old = os.readlink(link) if link.is_symlink() else None
        (self.root / "..data_tmp").symlink_to(new.name)
        os.replace(self.root / "..data_tmp", link)
        for path in data:
            if not (self.root / path).is_symlink():
                (self.root / path).symlink_to(f"..data/{path}")
        if old is not None:
            for file in (self.root / old).iterdir():
                file.unlink()
            (self.root / old).rmdir()
        self.data = data
        return True


def _expand(value: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion of ``command``/``args`` (``$$`` escapes)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        value,
    )


class SidecarProcess:
    """The injected container of ``pod``, run as the kubelet would run it, with the pod's
    volumes at ``volumes`` (volume name -> directory of the test)."""

    def __init__(self, pod: Mapping[str, Any], volumes: Mapping[str, pathlib.Path], log: pathlib.Path) -> None:
        found = find_sidecar(pod["spec"])
        assert found is not None, "the pod has no kafka-cleaner container"
        container = found[1]
        assert container["command"] == ["kafka-cleaner"]  # on the image's PATH
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"]}
        env = {
            e["name"]: e.get("value") or fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container.get("env") or []
        }
        mounts = sorted(
            ((m["mountPath"], volumes[m["name"]]) for m in container["volumeMounts"]), key=lambda m: -len(m[0])
        )

        def host_path(arg: str) -> str:
            for mount_path, directory in mounts:
                if arg == mount_path or arg.startswith(mount_path + "/"):
                    return str(directory) + arg[len(mount_path) :]
            return arg

        args = [host_path(_expand(arg, env)) for arg in container["args"]]
        listen = args.index("--listen") + 1
        host, _, port = args[listen].rpartition(":")
        assert host == "0.0.0.0"
        args[listen] = f"127.0.0.1:{port}"  # the pod network of this test
        self.port = int(port)
        self.argv = [str(KAFKA_CLEANER), *args]
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONSAFEPATH": "1", **env}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(
            lambda: self._alive() and self.get("/healthz") == 200,
            timeout=TIMEOUT,
            interval=0.1,
            what=f"the sidecar's /healthz on port {self.port}",
        )

    def _alive(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the sidecar exited with {self.process.returncode}:\n{self.log.read_text()}")
        return True

    def get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5) as response:
            return dict(json.loads(response.read()))

    def kill(self) -> None:
        """SIGKILL: the container dies, nothing answers on its port."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(TIMEOUT)

    def stop(self) -> int:
        """SIGTERM, as the kubelet stops a container; the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(TIMEOUT)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT)


def files_of(root: pathlib.Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: size and SHA-256 (the data a read-only mount protects)."""
    return {
        str(f.relative_to(root)): (f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest())
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }
