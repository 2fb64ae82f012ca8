"""The alerts of components/monitoring, run by Prometheus' own rule engine (promtool).

The rendered PrometheusRule's groups are written to a rule file beside a copy of
tests/promtool/vmpool-alerts.test.yaml and ``promtool test rules`` runs the cases:
two installs (namespaces ``prod`` and ``staging``) in one Prometheus, one broken, and
each alert must fire for the broken one only, carrying its namespace. The same cases
fail on the rules aggregated without ``namespace`` (the test of the test). A static
check adds that every aggregation and every ``on (...)`` of every rule keeps
``namespace``, and that no rule uses ``absent()`` (which cannot say which install).

promtool comes from Debian's ``prometheus`` package (.ci/apt-packages); without it the
promtool tests skip, saying so.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8shelp import find, render

ROOT = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "promtool" / "vmpool-alerts.test.yaml"
RULES_FILE = "vmpool-rules.yaml"

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not on PATH: deploy/k8s cannot be rendered (kubectl kustomize)",
)

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not on PATH: install Debian's `prometheus` package (.ci/apt-packages)",
)

# PromQL's aggregation operators (max_over_time and friends are functions, not these).
AGGREGATION_RE = re.compile(
    r"\b(sum|min|max|avg|group|count|stddev|stdvar|topk|bottomk|quantile|count_values)"
    r"\s*(?:(by|without)\s*\(([^)]*)\))?\s*\("
)
MATCHING_RE = re.compile(r"\b(on|ignoring)\s*\(([^)]*)\)")


def rule_groups() -> dict[str, Any]:
    """The ``spec`` of the prod overlay's PrometheusRule: a Prometheus rule file (a
    copy: the rendering is cached)."""
    (rule,) = find(render("overlays/prod"), "PrometheusRule")
    return dict(copy.deepcopy(rule["spec"]))


def rules() -> list[dict[str, Any]]:
    return [r for group in rule_groups()["groups"] for r in group["rules"]]


def write_rule_file(spec: dict[str, Any], directory: Path) -> Path:
    """``spec`` as promtool's rule file, each rule keeping only its summary annotation
    (the cases check it; descriptions are prose); the cases beside it."""
    spec = yaml.safe_load(yaml.safe_dump(spec))
    for group in spec["groups"]:
        for rule in group["rules"]:
            if "annotations" in rule:
                rule["annotations"] = {"summary": rule["annotations"]["summary"]}
    path = directory / RULES_FILE
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(CASES, directory / CASES.name)
    return path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@needs_promtool
def test_rules_pass_promtool_check_and_unit_tests(tmp_path: Path) -> None:
    write_rule_file(rule_groups(), tmp_path)
    check = promtool("check", "rules", RULES_FILE, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    run = promtool("test", "rules", CASES.name, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


@needs_promtool
def test_the_cases_fail_on_rules_that_drop_the_namespace(tmp_path: Path) -> None:
    """The same cases against the rules aggregated over every install (``by
    (namespace)`` taken out): promtool must report failures, with the alert of the
    issue among them (staging's workers hiding prod's NoWorkerAlive)."""
    spec = rule_groups()
    for rule in (r for group in spec["groups"] for r in group["rules"]):
        expr = str(rule["expr"])
        expr = re.sub(r"by \(namespace\)", "", expr)
        expr = re.sub(r"by \(namespace, ", "by (", expr)
        expr = re.sub(r"on \(namespace\)", "on ()", expr)
        expr = re.sub(r"group  \(", "group (", expr)
        rule["expr"] = expr
    write_rule_file(spec, tmp_path)
    run = promtool("test", "rules", CASES.name, cwd=tmp_path)
    assert run.returncode != 0, "the promtool cases pass on rules without namespace"
    assert "alertname: VmpoolNoWorkerAlive" in run.stdout + run.stderr


def test_every_alert_has_a_case_per_namespace() -> None:
    """Each alert is expected to fire in at least one case, and every expected alert
    names its namespace (promtool compares labels exactly: the alert carries it)."""
    cases = yaml.safe_load(CASES.read_text())
    assert cases["rule_files"] == [RULES_FILE]
    fired: dict[str, set[str]] = {}
    for case in cases["tests"]:
        namespaces = {
            m.group(1)
            for s in case["input_series"]
            for m in [re.search(r'namespace="([^"]+)"', s["series"])]
            if m
        }
        assert namespaces == {"prod", "staging"}, f"{case['name']}: two installs, {namespaces}"
        for check in case.get("alert_rule_test", []):
            for alert in check["exp_alerts"]:
                assert alert["exp_labels"].get("namespace") in namespaces, case["name"]
                fired.setdefault(check["alertname"], set()).add(alert["exp_labels"]["namespace"])
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert set(fired) == alerts, f"alerts without a firing case: {alerts - set(fired)}"


def test_every_aggregation_keeps_the_namespace() -> None:
    problems: list[str] = []
    for rule in rules():
        name = rule.get("alert") or rule.get("record")
        expr = str(rule["expr"])
        if "absent(" in expr or "absent_over_time(" in expr:
            problems.append(f"{name}: absent() cannot say which install is missing")
        for op, mode, labels in AGGREGATION_RE.findall(expr):
            kept = {label.strip() for label in labels.split(",")}
            if mode != "by" or "namespace" not in kept:
                problems.append(f"{name}: `{op} {mode} ({labels})` drops namespace")
        for mode, labels in MATCHING_RE.findall(expr):
            kept = {label.strip() for label in labels.split(",")}
            if (mode == "on") != ("namespace" in kept):
                problems.append(f"{name}: `{mode} ({labels})` does not match on namespace")
        if rule.get("record"):
            assert str(rule["record"]).startswith("namespace:"), name
    assert not problems, "\n".join(problems)


def test_the_static_check_can_fail() -> None:
    assert AGGREGATION_RE.findall("max(vmpool_workers_alive) == 0") == [("max", "", "")]
    assert AGGREGATION_RE.findall("max by (job) (x)") == [("max", "by", "job")]
    assert AGGREGATION_RE.findall("max_over_time(x[5m])") == []
    assert MATCHING_RE.findall("a and on () b") == [("on", "")]
