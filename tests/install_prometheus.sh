#!/usr/bin/env bash
# `make test` needs Prometheus: promtool checks and unit-tests the alert rules, and the
# operations tests start their own server on a free port. Installed from Debian's package if missing.
set -euo pipefail
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "make test: installing Prometheus (Debian's package)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
    || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }
  # The package starts a server of its own on 9090 where an init system runs it: not wanted here.
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl disable --now prometheus
  elif [ -x /etc/init.d/prometheus ]; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
fi
