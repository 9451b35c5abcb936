"""The alert rules are valid and each fires from synthetic series (`promtool`, from
Debian's `prometheus` package); every alert tells the on-call what to do; every metric
the alerts and the dashboard read is one a service defines (or RabbitMQ's, Prometheus's)."""

import json
import re
import subprocess

import yaml
from prometheus_client import REGISTRY

import shared.observability  # noqa: F401 (defines the metrics)
from tests.prometheus import ALERTS, DASHBOARD, alert_expressions, binary, dashboard_expressions

ALERTS_TEST = ALERTS.parent / "alerts_test.yml"
# Series that come from elsewhere: RabbitMQ's plugin, the process collector, Prometheus itself.
FOREIGN = re.compile(r"^(rabbitmq_|process_|up$)")
FUNCTIONS = {
    "sum", "max", "min", "by", "without", "rate", "increase", "histogram_quantile", "or", "and", "vector",
    "absent", "le", "count", "avg", "on", "ignoring", "bool", "unless",
}


def test_promtool_accepts_the_alert_rules():
    checked = subprocess.run([binary("promtool"), "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_promtool_fires_each_alert_from_synthetic_series():
    tested = subprocess.run(
        [binary("promtool"), "test", "rules", ALERTS_TEST.name], capture_output=True, text=True, cwd=ALERTS.parent
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    names = {rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]}
    fired = set()
    for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        fired |= {case["alertname"] for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert names == fired, f"alerts no test fires: {names - fired}"


def test_every_alert_says_what_to_do():
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            summary = rule.get("annotations", {}).get("summary", "")
            assert len(summary) > 60, f"{rule['alert']} has no summary worth the name"
            assert rule["labels"]["severity"] in ("warning", "critical")


def _metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', "", expr)
    without_labels = re.sub(r"\{[^}]*\}", "", without_strings)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_ranges))
    return {w for w in words if w not in FUNCTIONS and not w.startswith("__") and ("_" in w or w == "up")}


def _defined() -> set[str]:
    names = set()
    for metric in REGISTRY.collect():
        names.add(metric.name)
        names |= {sample.name for sample in metric.samples}
        if metric.type == "counter":
            names.add(metric.name + "_total")
        if metric.type == "histogram":
            names |= {metric.name + suffix for suffix in ("_bucket", "_count", "_sum")}
    return names


def test_the_alerts_and_the_dashboard_read_only_metrics_that_exist():
    defined = _defined()
    for expr in alert_expressions() + dashboard_expressions():
        # Grouping labels read like names; only signoff_ names are checked against the registry.
        for name in _metric_names(expr):
            if name.startswith("signoff_"):
                assert name in defined, f"{expr!r} reads {name}, which no service defines"
            else:
                assert FOREIGN.match(name) or name in ("tool", "outcome", "job", "instance", "queue", "type",
                                                      "reason", "hook", "provider", "status", "direction"), (
                    f"{expr!r} reads {name!r}"
                )


def test_the_dashboard_is_a_grafana_dashboard_on_the_provisioned_data_source():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "signoff" and dashboard["panels"]
    datasource = yaml.safe_load((DASHBOARD.parent / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == uid, panel["title"]
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("approvals waiting", "oldest waiting", "decision", "outcome", "queue depth", "relay lag",
                  "dead letters", "cpu", "memory"):
        assert topic in titles, f"the dashboard shows no {topic}"
