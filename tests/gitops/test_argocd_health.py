"""The Argo CD health check (gitops/argocd/health.lua) under the real Lua interpreter.

Every case of gitops/argocd/health_test.yaml (Argo CD's own test-table format) runs through
``lua5.4`` in a sandbox shaped like the one Argo CD gives scripts from argocd-cm: the object as
the global ``obj`` (converted the way Argo CD converts it: maps and lists become tables, null
becomes nil, numbers become plain numbers), and only the base, table and a safe os library, with
no string library and no string methods. A script that passes here therefore runs in Argo CD.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
ARGOCD = REPO / "gitops" / "argocd"
LUA = shutil.which("lua5.4")
HEALTH_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}

pytestmark = pytest.mark.skipif(
    LUA is None, reason="lua5.4 is not installed (apt-get install lua5.4; scripts/setup-system.sh does it)")

# Argo CD's sandbox for argocd-cm health scripts (util/lua/lua.go: base, table, package and a
# safe os; gopher-lua). The object is loaded before the string methods are taken away.
HARNESS = r"""
local script_path, object_path = arg[1], arg[2]
local sandbox = {
  assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, pcall = pcall,
  print = print, rawequal = rawequal, rawget = rawget, rawset = rawset, getmetatable = getmetatable,
  setmetatable = setmetatable,
  select = select, tonumber = tonumber, tostring = tostring, type = type, xpcall = xpcall,
  unpack = table.unpack,
  table = {concat = table.concat, insert = table.insert, remove = table.remove, sort = table.sort},
  os = {clock = os.clock, date = os.date, difftime = os.difftime, time = os.time},
}
sandbox._G = sandbox
sandbox.obj = assert(loadfile(object_path, "t", {}))()
getmetatable("").__index = nil
local hs = assert(loadfile(script_path, "t", sandbox))()
io.write(tostring(hs.status), "\n", tostring(hs.message or ""))
"""


class _KubernetesYamlLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads it: timestamps stay strings (JSON has no timestamp type)."""


_KubernetesYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(path: pathlib.Path) -> Any:
    return yaml.load(path.read_text(), Loader=_KubernetesYamlLoader)


def lua_string(text: str) -> str:
    """A Lua string literal of ``text``'s UTF-8 bytes, escaping all but printable ASCII."""
    escaped = (chr(b) if 0x20 <= b < 0x7F and chr(b) not in '"\\' else f"\\{b:03d}" for b in text.encode())
    return '"' + "".join(escaped) + '"'


def lua_literal(value: Any) -> str:
    """``value`` (parsed JSON/YAML) as a Lua expression, as Argo CD hands objects to Lua.

    Integral numbers are written without a fraction: Argo CD's gopher-lua prints float64 3 as
    ``3``, and so does Lua 5.4 for the integer 3 (but ``3.0`` for the float).
    """
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_string(str(k))}] = {lua_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not JSON data: {value!r}")


def lua(script: pathlib.Path, obj: Any, tmp_path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``script`` run on ``obj`` in the sandbox."""
    (tmp_path / "harness.lua").write_text(HARNESS)
    (tmp_path / "object.lua").write_text("return " + lua_literal(obj) + "\n")
    return subprocess.run([str(LUA), str(tmp_path / "harness.lua"), str(script), str(tmp_path / "object.lua")],
                          capture_output=True, text=True, timeout=30)


def run_lua(script: pathlib.Path, obj: Any, tmp_path: pathlib.Path) -> tuple[str, str]:
    """(status, message) of ``script`` run on ``obj`` in the sandbox."""
    done = lua(script, obj, tmp_path)
    assert done.returncode == 0, done.stderr
    status, _, message = done.stdout.partition("\n")
    return status, message


CASES = load_yaml(ARGOCD / "health_test.yaml")["tests"]


@pytest.mark.parametrize("case", CASES, ids=[c["inputPath"] for c in CASES])
def test_health_check_case(case: dict[str, Any], tmp_path: pathlib.Path) -> None:
    obj = load_yaml(ARGOCD / case["inputPath"])
    status, message = run_lua(ARGOCD / "health.lua", obj, tmp_path)
    assert status in HEALTH_STATUSES
    assert {"status": status, "message": message} == {"message": "", **case["healthStatus"]}


def test_every_input_is_in_the_table() -> None:
    listed = {c["inputPath"] for c in CASES}
    assert {f"health_test/{p.name}" for p in (ARGOCD / "health_test").glob("*.yaml")} == listed


def test_the_object_reaches_lua_as_argo_cd_converts_it(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.lua"
    probe.write_text('return {status = "Healthy", message = obj.s .. "|" .. obj.list[2].n .. "|" .. #obj.list\n'
                     '  .. "|" .. obj.f .. "|" .. tostring(obj.t) .. "|" .. tostring(obj.gone) .. "|" .. obj.when}\n')
    healthy = load_yaml(ARGOCD / "health_test" / "healthy.yaml")
    obj = {"s": 'quote " back\\ slash\nnewline é', "list": [{"n": 1}, {"n": 2.0}], "f": 0.5, "t": True,
           "gone": None, "when": healthy["metadata"]["creationTimestamp"]}  # a YAML timestamp, kept a string
    _, message = run_lua(probe, obj, tmp_path)
    assert message == 'quote " back\\ slash\nnewline é|2|2|0.5|true|nil|2026-11-02T09:14:00Z'


def test_the_sandbox_has_no_string_library(tmp_path: pathlib.Path) -> None:
    """The harness must refuse what Argo CD refuses, or a passing case would prove nothing."""
    script = tmp_path / "forbidden.lua"
    for body in ('string.format("%d", 1)', '("x"):upper()', "math.floor(1.5)", 'io.write("x")'):
        script.write_text(f"return {{status = {body}}}\n")
        assert lua(script, {}, tmp_path).returncode != 0, body
