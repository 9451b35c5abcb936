#!/usr/bin/env bash
# Start whichever of PostgreSQL, Redis and RabbitMQ (with its management API and Prometheus
# plugin) is down on this machine. `make run`, `make test` and `.ci/run` call it, so the
# README's two commands work on a fresh machine where the services are installed but
# RabbitMQ's plugins are not yet enabled. Where everything is up it only looks (a few ms).
set -euo pipefail
# Services elsewhere (SIGNOFF_* URLs pointing at them): SIGNOFF_LOCAL_SERVICES=0 skips this.
[ "${SIGNOFF_LOCAL_SERVICES:-1}" = 0 ] && exit 0

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() {
  for _ in $(seq 1 60); do up "$2" && return 0; sleep 1; done
  echo "services: $1 did not come up on port $2" >&2; return 1
}

if ! up 5432; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  wait_for PostgreSQL 5432
fi
if ! up 6379; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis 6379
fi
if ! up 5672; then
  echo "services: starting RabbitMQ"
  rabbitmq-server -detached
  wait_for RabbitMQ 5672
fi
# `signoff setup` makes each deployment's broker users through the management API.
if ! up 15672; then
  echo "services: enabling RabbitMQ's management API"
  rabbitmq-plugins enable rabbitmq_management
  wait_for "RabbitMQ's management API" 15672
fi

# The operations tests scrape RabbitMQ's own metrics (per queue) on 15692.
if ! up 15692; then
  echo "services: enabling RabbitMQ's Prometheus plugin"
  rabbitmq-plugins enable rabbitmq_prometheus
  wait_for "RabbitMQ's Prometheus plugin" 15692
fi
