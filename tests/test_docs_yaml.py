"""Every YAML block in the docs does what its comments and the text around it say (issue 27
item 2; ``tests/test_examples.py`` runs ``examples/``).

- README, "The policy file": the spec parses with the product's parser and every value it
  shows is the default it claims; its comments on ``match`` hold (a full regular expression,
  the first matching rule wins, unmatched topics untouched).
- The chart README's ``networkPolicy`` block: ``tests/k8s/test_chart.py`` renders it with the
  real helm.
- gitops/README.md: the Argo CD ``argocd-cm`` block holds ``health.lua`` under the key Argo CD
  reads; the ``ignoreResourceUpdates`` pointers and jq paths name fields of the CRD's status;
  the Flux ``healthCheckExprs`` (CEL, evaluated with cel-python; Flux runs cel-go) give, on
  every case of Argo CD's test table for ``health.lua``, the verdict the README promises
  (Healthy: current, Degraded: failed, Progressing: in progress, AwaitingManualRollout: current).
- docs/operator.md, the sidecar's container: ``tests/operator/test_injection.py`` builds the
  container; this module checks the block's command line against the sidecar's own parser.

Not run here: the Flux Kustomization itself (no Flux controllers on this machine).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cleaner.config import TopicRule, parse_policy_text

REPO = Path(__file__).resolve().parents[1]


def yaml_blocks(path: Path) -> list[str]:
    text = path.read_text()
    return [m.group(2) for m in re.finditer(r"^( *)```ya?ml\n(.*?)^\1```", text, re.S | re.M)]


def the_block(path: Path, containing: str) -> str:
    [block] = [b for b in yaml_blocks(path) if containing in b]
    return block


# -- README: the policy file --------------------------------------------------------------------


def test_the_readme_policy_shows_the_defaults_and_its_match_comments_hold() -> None:
    block = the_block(REPO / "README.md", "maxCompactionLagMs")
    policy = parse_policy_text(block)
    defaults = parse_policy_text("spec: {topics: [{match: 'orders-.*', cleanupPolicy: compact}]}")
    assert policy == defaults, "a value the README shows is not the parser's default"
    (rule,) = policy.topics
    assert rule == TopicRule(match="orders-.*", cleanup_policy=rule.cleanup_policy)  # every other field a default
    # "a regular expression, not a glob", "matches the WHOLE topic name", "unmatched topics are never touched"
    assert policy.rule_for("orders-eu") is rule
    assert policy.rule_for("orders") is None and policy.rule_for("old-orders-eu") is None
    as_a_glob = parse_policy_text(block.replace('"orders-.*"', '"orders-*"'))
    assert as_a_glob.rule_for("orders-eu") is None  # orders followed by dashes


# -- gitops/README.md ----------------------------------------------------------------------------

GITOPS = REPO / "gitops" / "README.md"
HEALTH = REPO / "gitops" / "argocd"


def test_the_argocd_cm_block_holds_the_health_check_under_argo_cds_key() -> None:
    block = the_block(GITOPS, "resource.customizations.health.")
    lua = (HEALTH / "health.lua").read_text()
    indented = "".join(f"    {line}\n" if line else "\n" for line in lua.splitlines())
    filled = re.sub(r"    local hs = \{\}\n    -- \.\.\. .*?\n    return hs\n", lambda _: indented, block, flags=re.S)
    config_map = yaml.safe_load(filled)
    # Argo CD's key: resource.customizations.health.<group>_<kind>
    assert config_map["data"]["resource.customizations.health.kafkacleaner.io_CompactionPolicy"] == lua + (
        "" if lua.endswith("\n") else "\n"
    )


def _status_schema() -> dict[str, Any]:
    crd = yaml.safe_load((REPO / "crds" / "compactionpolicy.yaml").read_text())
    [served] = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return served["schema"]["openAPIV3Schema"]["properties"]["status"]


def _has_path(schema: dict[str, Any], parts: list[str]) -> bool:
    """Whether the schema has the path; ``name[]`` steps into an array's items or a map's values."""
    for part in parts:
        name, each = part.removesuffix("[]?").removesuffix("[]"), part.endswith(("[]", "[]?"))
        props = schema.get("properties") or {}
        if name not in props:
            return False
        schema = props[name]
        if each:
            schema = schema.get("items") or schema.get("additionalProperties") or {}
    return True


def test_the_ignored_status_fields_are_fields_of_the_status() -> None:
    status = _status_schema()
    key = "resource.customizations.ignoreResourceUpdates.kafkacleaner.io_CompactionPolicy"
    block = yaml.safe_load(the_block(GITOPS, f"{key}: |\n    jsonPointers"))
    pointers = yaml.safe_load(block["data"][key])["jsonPointers"]
    for pointer in pointers:
        parts = pointer.strip("/").split("/")
        assert parts[0] == "status" and _has_path(status, parts[1:]), pointer
    jq = yaml.safe_load(yaml.safe_load(the_block(GITOPS, "jqPathExpressions"))["data"][
        "resource.customizations.ignoreResourceUpdates.kafkacleaner.io_CompactionPolicy"])["jqPathExpressions"]
    for expression in jq:
        parts = expression.strip(".").split(".")
        assert parts[0] == "status" and _has_path(status, parts[1:]), expression


def _health_cases() -> list[tuple[str, dict[str, Any]]]:
    table = yaml.safe_load((HEALTH / "health_test.yaml").read_text())["tests"]
    return [(case["healthStatus"]["status"], yaml.safe_load((HEALTH / case["inputPath"]).read_text()))
            for case in table]


def _flux_verdict(expressions: dict[str, str], policy: dict[str, Any]) -> str:
    """Flux's order: observedGeneration first, then inProgress, failed, current; none: in progress."""
    import celpy

    status = policy.get("status") or {}
    generation = (policy.get("metadata") or {}).get("generation")
    if "observedGeneration" in status and status["observedGeneration"] != generation:
        return "InProgress"
    env = celpy.Environment()
    activation = {"status": celpy.json_to_cel(status), "metadata": celpy.json_to_cel(policy.get("metadata") or {})}
    for key, verdict in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        if bool(env.program(env.compile(expressions[key])).evaluate(activation)):
            return verdict
    return "InProgress"


@pytest.mark.parametrize(("argo", "policy"), _health_cases(), ids=[c[1]["metadata"]["name"] + "-" + c[0]
                                                                    for c in _health_cases()])
def test_the_flux_health_expressions_agree_with_the_argo_cd_check(argo: str, policy: dict[str, Any]) -> None:
    pytest.importorskip("celpy", reason="cel-python (the test extra) evaluates the CEL")
    [check] = yaml.safe_load(the_block(GITOPS, "healthCheckExprs"))["spec"]["healthCheckExprs"]
    assert check["apiVersion"] == "kafkacleaner.io/v1alpha1" and check["kind"] == "CompactionPolicy"
    conditions = (policy.get("status") or {}).get("conditions") or []
    awaiting = any(c.get("reason") == "AwaitingManualRollout" for c in conditions)
    expected = {"Healthy": "Current", "Degraded": "Failed", "Progressing": "InProgress"}.get(argo)
    if awaiting:
        expected = "Current"  # README: "the expressions above count it current, and Argo CD shows it Suspended"
    elif argo == "Suspended":
        pytest.skip("a paused policy: Flux has no Suspended (README), the verdict follows Ready")
    assert _flux_verdict(check, policy) == expected


# -- docs/operator.md: the sidecar's command line ------------------------------------------------


def test_the_documented_sidecar_command_line_is_accepted_by_the_sidecar() -> None:
    """The contract "kafka-cleaner sidecar must accept it exactly": the block's args parse with
    the sidecar's own click command (--help exits 0 only when every option is known)."""
    from click.testing import CliRunner

    from cleaner.sidecar.command import sidecar_command

    block = the_block(REPO / "docs" / "operator.md", "name: kafka-cleaner")
    container = yaml.safe_load(re.sub(r"<[^>\n]*>", '"placeholder"', block))  # <spec.x> stands for a value
    assert container["command"] == ["kafka-cleaner"] and container["args"][0] == "sidecar"
    options = [a for a in container["args"][1:] if a.startswith("--")]
    help_text = CliRunner().invoke(sidecar_command, ["--help"]).output
    for option in options:
        assert option in help_text, option
