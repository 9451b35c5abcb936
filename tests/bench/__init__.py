"""`make bench`: one approval round trip, measured on the real services.

    .venv/bin/python -m tests.bench [--seconds 20] [--levels 1,16,64] [--recovery-tries 3]
                                    [--gateway-levels 16] [--gateway-runs 1]
                                    [--output PATH] [--quick] [--profile DIR]

The workload is one approval round trip: a session's model step asks for one
tool call that needs approval (sessions named `bench-*` get the `count` script
in tests/fixtures/script.yaml) -> the request is committed and its event
published -> the driver approves it -> the tool runs once -> its result closes
the call -> the next model step finishes the turn. The model is the scripted
provider and the tool increments an in-process counter, so the figures measure
Signoff, not its dependencies.

The four services run as separate processes on PostgreSQL (tests/harness.py's
`Deployment`, its own namespace and schema, removed at the end even on failure).
The driver is a channel adapter (adapter.py): it starts sessions, listens on ONE
watch queue bound to the events exchange with `#` (events are dispatched by
session id to per-session futures), and answers every approval.requested with an
approve carrying the card's args_digest.

    driver.py    the run: arguments, phases in order, the JSON, the exit status
    adapter.py   the channel adapter (on the tests' Console) and its round trip
    levels.py    one load level: closed-loop slots, the rate window, latencies, costs
    intake.py    the intake's level (`make bench` runs it after the others): a program's
                 file → approve → claim → report through the gateway, round trips/s and
                 Signoff's CPU per round trip
    mcp_proxy.py the MCP proxy's level (`make bench` runs it last): the latency the proxy
                 adds to an allowed call, and `ask` calls approved at once, per second
    gateway.py   the gateway level: the card from GET /v1/events, the approval by POST
                 /v1/requests/{id}/decision, beside an AMQP level of the same concurrency
    recovery.py  kill approval-ledger and publisher under pending approvals, time the recovery
    cpu.py       CPU of the services, the dependencies and the driver; py-spy profiles
    floors.py    what PostgreSQL and RabbitMQ alone do on this machine
    report.py    percentiles, the progress lines and the table printed at the end

How each figure is taken (docs/benchmarks.md repeats this):

- round trips/s: a closed loop of N slots is in steady state once N round trips
  have completed (about one per slot); the rate is the number of
  round trips completed from then (and not before a short warm-up, 10 % of the
  level, at most 2 s) to the level's deadline, divided by that window. Slots
  stop starting sessions at the deadline and finish the one they have; those
  drain round trips count for costs, not for the rate. A level too short to
  reach steady state falls back to all round trips over the whole level
  (`steady_state: false` in the JSON). Latency percentiles are over round
  trips started after the first completion (the second wave on).
- response -> tool executed: from just before the driver publishes the approve
  to `execution_claims.finished_at`, which the executor writes right after the
  tool returned (the durable "it ran" record). The JSON also keeps response ->
  closure committed (`closures.created_at`, the ledger's transaction time for
  tool.completed) and response -> tool.closed as seen by the driver, plus a
  median breakdown of every hop.
- turn start -> approval event: from just before the driver publishes
  turn.start to the driver receiving approval.requested.
- ledger transactions per round trip: inbox rows (one per ledger transition).
  "write transactions" adds the executor's two claim transactions per call
  (take, finish) and the publisher's mark-sent transactions (one per relay
  batch = distinct outbox.sent_at values). Read-only transactions (the relay's
  SELECT) are not counted.
- messages per round trip: outbox rows (published by the publisher) plus inbox
  rows (every message the ledger consumed: the driver's turn.start and
  approval.respond, model-step's step.completed, the executor's tool.completed).
  That is every message published to RabbitMQ once; redeliveries are not seen.
- ledger bytes per round trip: what the ledger's rows grew by over the level
  (PostgreSQL's `pg_column_size` of every row of every table, before and
  after), divided by its round trips; retention deletes sent outbox rows and
  old inbox rows later, so this is what a round trip writes, not what stays.
- long session (after the exactly-once check; `--long-session-turns`, default
  10, `--quick` 2): one session of turns of 50 model steps, each step but a
  turn's last reading the clock (no approval); per turn, the ledger bytes each
  of its steps added. Flat is the claim (docs/design.md, invariant 11).
- CPU per round trip: utime+stime from /proc/<pid>/stat of each service process
  before and after the level (drain included), divided by the level's round
  trips. The driver's own CPU and the dependencies' (postgres, beam.smp,
  redis-server, summed over their processes, machine-wide) are shown apart.
- gateway level (`--gateway-levels`, default 16, `--quick` 4): after the AMQP
  levels the HTTP gateway is started (one more process in the CPU figures,
  `gateway`) with an operator login `bench`; per level, an AMQP level of that
  concurrency and then, right after it, the same round trip with the card read
  from the gateway's event stream (one stream for every slot, opened at the
  newest event) and the approval POSTed (CSRF token, an Idempotency-Key); the
  rate ratio gateway/AMQP of the pair is the figure (`--gateway-runs N` pairs,
  median). The gateway's CPU per round trip is its /proc CPU over the level's
  round trips; its CPU per second with the stream open and no traffic (5 s
  before the level, from its threads' schedstat: nanoseconds, where utime and
  stime count 10 ms ticks) is reported beside it, since its polls cost per second,
  not per round trip. The target: at most 3 ms per round trip and a
  rate within 10 % of the AMQP channel's.
- floor: 16 asyncpg connections doing BEGIN; INSERT one row; COMMIT into a
  table in the bench schema; and aio-pika with publisher confirms, 16
  concurrent publishers of persistent 1 KB messages to a quorum queue under the
  bench namespace, consumed and acked by a consumer on another connection.
- recovery: N sessions wait on approval; SIGKILL approval-ledger and publisher;
  publish approvals for all of them while they are down; start both again and
  time from just before the start to the first of those calls executed
  (execution_claims.finished_at) and closed (closures.created_at). Each try is
  made three ways: a warm restart (a fork of an interpreter that has the
  services loaded, as `signoff up` restarts a service), a cold one (a new
  interpreter, as a container restarts), and failover (nothing restarts: a
  second ledger and a standby publisher, started before the kill, carry on;
  timed from the kill).
- exactly once: at the end, every tool call of the run has exactly one claim
  with attempts == 1 and outcome output, exactly one closure of kind output,
  and the counter values recorded in the closures are exactly 1..N with N the
  number of round trips the driver saw complete (the executor is never
  restarted, so its counter counts every execution). Sessions idle, turns
  completed, no pending request, no dead letter, no rejection or failed turn.
  Any violation makes the run fail (exit status 1) after the figures are written.
  The check is tests/invariants.py's, the one the chaos run and the tests use,
  which also requires every queue drained, every outbox row sent, no session
  running, no closed call without a closure and no request id renamed.
"""
