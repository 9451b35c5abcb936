"""A real Prometheus server for the tests (Debian's `prometheus` package; `.ci/run`
installs it): a generated config that scrapes a deployment's services every second and
RabbitMQ's per-queue metrics (only this deployment's queues kept), with Signoff's alert
rules loaded; its HTTP API to query."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from shared.settings import PROJECT_ROOT
from tests.harness import free_port

ALERTS = PROJECT_ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = PROJECT_ROOT / "deploy" / "grafana" / "signoff.json"
RABBITMQ_PROMETHEUS = "127.0.0.1:15692"


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise AssertionError(
            f"{name} is not installed: `apt-get install -y prometheus` (Debian's package; `.ci/run` installs it)"
        )
    return found


class Prometheus:
    def __init__(self, workdir: Path, namespace: str, targets: dict[str, list[int]]) -> None:
        """`targets`: job (a service's name) -> the metrics ports of its replicas on 127.0.0.1."""
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}
                for job, ports in targets.items()
            ]
            + [
                {
                    "job_name": "rabbitmq",
                    "metrics_path": "/metrics/per-object",
                    "scrape_interval": "2s",
                    "scrape_timeout": "1900ms",
                    "static_configs": [{"targets": [RABBITMQ_PROMETHEUS]}],
                    # The broker is shared with other tests: keep this deployment's queues (and unlabelled series).
                    "metric_relabel_configs": [
                        {"source_labels": ["queue"], "regex": f"|{namespace}\\..*", "action": "keep"}
                    ],
                }
            ],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={self.config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-3000:]}")
            try:
                if self.http.get("/-/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus not ready within 30 s")

    def stop(self) -> None:
        self.http.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result; raises with Prometheus's own error if it does not evaluate."""
        answer = self.http.get("/api/v1/query", params={"query": expr}).json()
        if answer.get("status") != "success":
            raise AssertionError(f"{expr!r} does not evaluate: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The one value of a scalar-like query (None: no series)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr!r} gave {len(result)} series: {result}"
        return float(result[0]["value"][1]) if result else None

    def by(self, expr: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expr)}

    def targets_up(self) -> dict[str, str]:
        active = self.http.get("/api/v1/targets").json()["data"]["activeTargets"]
        return {f"{t['labels']['job']} {t['labels']['instance']}": t["health"] for t in active}


def dashboard_expressions() -> list[str]:
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def as_prometheus_sees_it(expr: str) -> str:
    """A dashboard expression with Grafana's variables given values."""
    return expr.replace("$__rate_interval", "1m").replace("$__range", "5m").replace("$__interval", "15s")
