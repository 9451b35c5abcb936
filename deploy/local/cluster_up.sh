#!/usr/bin/env bash
# A three-node RabbitMQ cluster and a PostgreSQL primary with a synchronous streaming
# standby, all on loopback, beside (never touching) the single-node services of
# services_up.sh. For the cluster tests (`make cluster-test`) and for trying Signoff
# past one machine on one machine. Idempotent: what is up is left alone, a node that
# is down (e.g. killed by a test) is started again, a promoted standby is rebuilt
# from the primary. `cluster_down.sh` stops exactly what this started.
#
#   RabbitMQ nodes signoff1..3@localhost: AMQP 5681..5683, distribution 25681..25683,
#   management 15681..15683, Prometheus 15701..15703; one Erlang cookie (the rabbitmq
#   user's), pause_minority, net_ticktime 10 s, quorum queue leaders balanced.
#   PostgreSQL clusters signoff_primary (5442) and signoff_standby (5443), database
#   `test`, trust on loopback; SIGNOFF_CLUSTER_SYNC=0 makes the replication asynchronous.
#
# The URLs to give Signoff (printed at the end):
#   SIGNOFF_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683/
#   SIGNOFF_DATABASE_URL=postgresql://postgres@127.0.0.1:5442,127.0.0.1:5443/test?target_session_attrs=read-write
set -euo pipefail

BASE=${SIGNOFF_CLUSTER_DIR:-/var/tmp/signoff-cluster}
PG_VERSION=${SIGNOFF_CLUSTER_PG_VERSION:-$(ls /etc/postgresql | sort -V | tail -n 1)}
SYNC=${SIGNOFF_CLUSTER_SYNC:-1}
NODES=(1 2 3)
# What a node cut off from the other two does: it pauses (closes its clients, confirms
# nothing) rather than go on alone and confirm messages the majority never sees.
PARTITION_HANDLING=pause_minority

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() {
  for _ in $(seq 1 90); do up "$2" && return 0; sleep 1; done
  echo "cluster: $1 did not come up on port $2" >&2; return 1
}
node() { echo "signoff$1@localhost"; }
ctl() { rabbitmqctl -q -n "$(node "$1")" "${@:2}"; }

# --- RabbitMQ ------------------------------------------------------------------
mkdir -p "$BASE"
chmod 755 "$BASE"
rabbit_config() {
  local n=$1 dir=$BASE/rabbit$1
  mkdir -p "$dir/mnesia" "$dir/log"
  cat >"$dir/rabbitmq.conf" <<CONF
listeners.tcp.local = 127.0.0.1:$((5680 + n))
management.tcp.ip = 127.0.0.1
management.tcp.port = $((15680 + n))
prometheus.tcp.ip = 127.0.0.1
prometheus.tcp.port = $((15700 + n))
# A node cut off from the other two pauses (closes its clients) instead of going on alone.
cluster_partition_handling = $PARTITION_HANDLING
# Quorum queue leaders spread over the nodes (the default puts them all where \`signoff setup\` connected).
queue_leader_locator = balanced
loopback_users = none
log.file.level = info
CONF
  # A dead peer is noticed in 10 s (ticks of 2.5 s) instead of 60.
  echo '[{kernel, [{net_ticktime, 10}]}].' >"$dir/advanced.config"
  echo '[rabbitmq_management,rabbitmq_prometheus].' >"$dir/enabled_plugins"
  # Our own env file: the machine's one names the shared node (rabbit@localhost).
  printf '%s\n' 'ERL_EPMD_ADDRESS=127.0.0.1' 'export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"' \
    >"$dir/rabbitmq-env.conf"
  chown -R rabbitmq:rabbitmq "$dir"
}
start_rabbit() {
  local n=$1 dir=$BASE/rabbit$1
  echo "cluster: starting RabbitMQ node $(node "$n")"
  # As the rabbitmq user (its home has the cookie); `su` without `-` keeps these variables.
  env RABBITMQ_NODENAME="$(node "$n")" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$((5680 + n)) \
    RABBITMQ_DIST_PORT=$((25680 + n)) RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_MNESIA_BASE="$dir/mnesia" \
    RABBITMQ_MNESIA_DIR="$dir/mnesia/node" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid" \
    su rabbitmq -s /bin/sh -c "cd '$dir' && /usr/lib/rabbitmq/bin/rabbitmq-server -detached"
}
for n in "${NODES[@]}"; do
  rabbit_config "$n"
  up $((5680 + n)) || start_rabbit "$n"
done
for n in "${NODES[@]}"; do wait_for "RabbitMQ $(node "$n")" $((5680 + n)); done
# Join 2 and 3 to 1 once (a node rejoins its cluster by itself when restarted).
for n in 2 3; do
  if ! ctl "$n" cluster_status --formatter json | grep -q "$(node 1)"; then
    echo "cluster: joining $(node "$n") to $(node 1)"
    ctl "$n" stop_app
    ctl "$n" join_cluster "$(node 1)"
    ctl "$n" start_app
  fi
done
# A node left cut off (a test stopped mid-split: tests/cluster/rig.py's cut_off) takes its
# peers' cookie back; a split the nodes remember (partitions, as with `ignore`) is healed as
# RabbitMQ heals one, by restarting the nodes of the minority side.
peers() { local m out=""; for m in "${NODES[@]}"; do [ "$m" = "$1" ] || out+="${out:+,}'$(node "$m")'"; done; echo "[$out]"; }
for n in "${NODES[@]}"; do
  ctl "$n" eval "[begin erlang:set_cookie(N, erlang:get_cookie()), net_kernel:connect_node(N) end || N <- $(peers "$n")]." >/dev/null
done
sleep 1
for cut in $(for n in "${NODES[@]}"; do ctl "$n" eval 'rabbit_node_monitor:partitions().'; done \
  | grep -o 'signoff[0-9]*@localhost' | sort | uniq -c | awk '$1 >= 2 {print $2}'); do
  n=${cut#signoff}; n=${n%@localhost}
  echo "cluster: restarting $cut, on the minority side of a split"
  ctl "$n" stop_app
  ctl "$n" start_app
done
for n in "${NODES[@]}"; do
  ctl "$n" await_startup
  wait_for "RabbitMQ management on $(node "$n")" $((15680 + n))
  wait_for "RabbitMQ Prometheus on $(node "$n")" $((15700 + n))
  # The running node too (it reads it at each lost peer): a node started before an edit has it at once.
  ctl "$n" eval "application:set_env(rabbit, cluster_partition_handling, $PARTITION_HANDLING)." >/dev/null
done

# `cluster_up.sh --rabbitmq-only`: the nodes alone (tests/chaos.py --cluster brings a killed
# node back while its PostgreSQL pair may have swapped roles, which the rest would refuse).
if [ "${1:-}" = --rabbitmq-only ]; then echo "cluster: RabbitMQ up"; exit 0; fi

# --- PostgreSQL ----------------------------------------------------------------
PGBIN=/usr/lib/postgresql/$PG_VERSION/bin
exists() { pg_lsclusters -h | awk '{print $2}' | grep -qx "$1"; }
pgctl() { pg_ctlcluster --skip-systemctl-redirect "$PG_VERSION" "$@"; }
sql() { psql -X -q -t -A -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "$2"; }
conf_dir() { echo "/etc/postgresql/$PG_VERSION/$1/conf.d"; }
data_dir() { echo "/var/lib/postgresql/$PG_VERSION/$1"; }

if ! exists signoff_primary; then
  echo "cluster: creating PostgreSQL signoff_primary on 5442"
  pg_createcluster "$PG_VERSION" signoff_primary -p 5442 -- --auth-local=trust --auth-host=trust >/dev/null
  cat >"$(conf_dir signoff_primary)/signoff.conf" <<CONF
listen_addresses = '127.0.0.1'
max_connections = 400
wal_level = replica
max_wal_senders = 10
wal_keep_size = '512MB'
hot_standby = on
# The services' commit waits until the standby has flushed it (SIGNOFF_CLUSTER_SYNC=0: it does not).
synchronous_commit = on
CONF
fi
# Set each run, so SIGNOFF_CLUSTER_SYNC switches it (ALTER SYSTEM: the tests switch it too).
if [ "$SYNC" = 1 ]; then standbys="signoff_standby"; else standbys=""; fi
up 5442 || { echo "cluster: starting PostgreSQL signoff_primary"; pgctl signoff_primary start; }
wait_for "PostgreSQL signoff_primary" 5442
until sql 5442 "select 1" >/dev/null 2>&1; do sleep 0.5; done
if [ "$(sql 5442 'select pg_is_in_recovery()')" != f ]; then
  echo "cluster: signoff_primary is in recovery (not a primary); run cluster_down.sh --purge and start again" >&2
  exit 1
fi
[ "$(sql 5442 "select count(*) from pg_database where datname = 'test'")" = 1 ] || sql 5442 "create database test"

make_standby() {
  echo "cluster: (re)building PostgreSQL signoff_standby on 5443 from signoff_primary"
  if exists signoff_standby; then
    pgctl signoff_standby stop -m immediate 2>/dev/null || true
  else
    pg_createcluster "$PG_VERSION" signoff_standby -p 5443 -- --auth-local=trust --auth-host=trust >/dev/null
    cp "$(conf_dir signoff_primary)/signoff.conf" "$(conf_dir signoff_standby)/signoff.conf"
  fi
  local data; data=$(data_dir signoff_standby)
  rm -rf "$data"
  install -d -o postgres -g postgres -m 700 "$data"
  su postgres -c "$PGBIN/pg_basebackup -h 127.0.0.1 -p 5442 -U postgres -D '$data' -X stream -c fast"
  # What -R would write, with the name synchronous_standby_names waits for.
  su postgres -c "touch '$data/standby.signal' && echo \"primary_conninfo = 'host=127.0.0.1 port=5442 user=postgres application_name=signoff_standby'\" >> '$data/postgresql.auto.conf' && sed -i '/synchronous_standby_names/d' '$data/postgresql.auto.conf'"
  pgctl signoff_standby start
}
if ! exists signoff_standby || [ ! -s "$(data_dir signoff_standby)/PG_VERSION" ]; then
  make_standby
else
  up 5443 || pgctl signoff_standby start || true
  for _ in $(seq 1 20); do sql 5443 "select 1" >/dev/null 2>&1 && break; sleep 0.5; done
  # Promoted by a test (or no longer following this primary): rebuilt as the standby.
  if [ "$(sql 5443 'select pg_is_in_recovery()' 2>/dev/null)" != t ] \
    || [ "$(sql 5442 "select count(*) from pg_stat_replication where application_name = 'signoff_standby'")" != 1 ]; then
    make_standby
  fi
fi
wait_for "PostgreSQL signoff_standby" 5443
for _ in $(seq 1 60); do
  state=$(sql 5442 "select sync_state from pg_stat_replication where application_name = 'signoff_standby'")
  [ -n "$state" ] && break
  sleep 0.5
done
# Only now: a commit on a primary whose synchronous standby is missing waits for it.
sql 5442 "alter system set synchronous_standby_names = '$standbys'" >/dev/null
sql 5442 "select pg_reload_conf()" >/dev/null
sleep 0.5
state=$(sql 5442 "select sync_state from pg_stat_replication where application_name = 'signoff_standby'")
echo "cluster: up (replication ${state:-none}); the URLs to give Signoff:"
echo "  SIGNOFF_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683/"
echo "  SIGNOFF_RABBITMQ_ADMIN_URL=http://guest:guest@127.0.0.1:15681/"
echo "  SIGNOFF_DATABASE_URL=postgresql://postgres@127.0.0.1:5442,127.0.0.1:5443/test?target_session_attrs=read-write"
