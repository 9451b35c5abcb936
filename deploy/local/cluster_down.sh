#!/usr/bin/env bash
# Stop what cluster_up.sh started: the RabbitMQ nodes signoff1..3@localhost and the
# PostgreSQL clusters signoff_primary and signoff_standby; never the machine's shared
# services. --purge also deletes their data (the next cluster_up.sh starts afresh).
set -uo pipefail
BASE=${SIGNOFF_CLUSTER_DIR:-/var/tmp/signoff-cluster}
PG_VERSION=${SIGNOFF_CLUSTER_PG_VERSION:-$(ls /etc/postgresql | sort -V | tail -n 1)}
for n in 1 2 3; do
  pidfile=$BASE/rabbit$n/pid
  if rabbitmqctl -q -n "signoff$n@localhost" stop 2>/dev/null; then
    echo "cluster_down: stopped signoff$n@localhost"
  elif [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill -KILL "$(cat "$pidfile")" && echo "cluster_down: killed signoff$n@localhost"
  fi
done
for cluster in signoff_standby signoff_primary; do
  if pg_lsclusters -h | awk '{print $2}' | grep -qx "$cluster"; then
    pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$cluster" stop -m fast 2>/dev/null \
      && echo "cluster_down: stopped PostgreSQL $cluster"
    [ "${1:-}" = --purge ] && pg_dropcluster "$PG_VERSION" "$cluster" && echo "cluster_down: dropped $cluster"
  fi
done
[ "${1:-}" = --purge ] && rm -rf "$BASE" && echo "cluster_down: removed $BASE"
exit 0
