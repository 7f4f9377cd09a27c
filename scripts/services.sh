#!/usr/bin/env bash
# Starts and stops the real servers that the integration tests and the local demo talk to:
# one redis-server, one single-node Apache Kafka broker (KRaft, broker and controller in one
# JVM) and one PostgreSQL cluster, all on free 127.0.0.1 ports, with fresh data directories.
#
#   scripts/services.sh start DIR [--only redis|kafka|postgres]
#   scripts/services.sh stop DIR
#   scripts/services.sh status DIR
#
# `start` waits, each wait bounded, until each server answers as the process it started (Redis:
# INFO names our PID; Kafka: a metadata round trip lists one broker on each of its three client
# listeners, and our JVM holds the port; PostgreSQL: a query names our data directory) and then
# writes DIR/services.env, KEY=VALUE lines that the tests read:
#   WXG_TEST_REDIS_HOST, WXG_TEST_REDIS_PORT, WXG_TEST_KAFKA_BOOTSTRAP, WXG_TEST_PG_DSN (a libpq
#   connection string), WXG_SERVICES_{REDIS,KAFKA}_{PID,LOG,DATA},
#   WXG_SERVICES_KAFKA_CONTROLLER_PORT and WXG_SERVICES_PG_{PID,LOG,DIR}; and, for `stop`,
#   WXG_SERVICES_{REDIS,KAFKA,PG}_PROC=PID:START (START: the process's start time).
#   The broker also listens with SASL_PLAINTEXT and with SASL_SSL (a CA and a broker certificate
#   made with openssl for this run): WXG_TEST_KAFKA_SASL_BOOTSTRAP, WXG_TEST_KAFKA_SSL_BOOTSTRAP,
#   WXG_TEST_KAFKA_CA (the CA's PEM file, for ssl.ca.location), WXG_TEST_KAFKA_SASL_MECHANISM
#   (PLAIN; SCRAM-SHA-256 takes the same user too), WXG_TEST_KAFKA_SASL_USER and
#   WXG_TEST_KAFKA_SASL_PASSWORD (fresh every run).
# Values never contain spaces unless DIR does, so a shell can `. DIR/services.env` it.
# The servers run detached (own session, stdin from /dev/null, output to DIR/*.log), so the
# caller, e.g. ctest, does not wait for them. `stop` ends exactly the processes recorded in the
# env file (SIGTERM, then SIGKILL after a bound), removes their data and keeps the logs.
#
# Environment:
#   WXG_CACHE_DIR           where scripts/setup.sh put the Kafka jars (default: <repo>/.cache)
#   WXG_TEST_TIMEOUT_SCALE  integer factor for every wait (default 1)
#   WXG_KAFKA_HEAP          maximum broker heap (default 512m)
#   WXG_PG_USER             the unprivileged account PostgreSQL runs as (default postgres)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_dir=${WXG_CACHE_DIR:-$repo/.cache}
kafka_libs=$cache_dir/kafka-libs
scale=${WXG_TEST_TIMEOUT_SCALE:-1}
[[ $scale =~ ^[1-9][0-9]*$ ]] || scale=1

log() { printf 'services: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

usage() {
  cat >&2 <<'EOF'
usage: services.sh start DIR [--only redis|kafka|postgres]
       services.sh stop DIR
       services.sh status DIR
EOF
  exit 2
}

now_ms() { date +%s%3N; }

# A TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's ephemeral range
# so that outgoing connections do not take it in the meantime. The caller still copes with
# losing a race (the server then fails to bind and is started again on other ports).
pick_port() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      printf '%s\n' "$p"
      return 0
    fi
  done
  return 1
}

# The value of KEY in the env file, or empty.
env_get() {
  local file=$1 key=$2 k v
  [[ -f $file ]] || return 0
  while IFS='=' read -r k v; do
    if [[ $k == "$key" ]]; then
      printf '%s\n' "$v"
      return 0
    fi
  done <"$file"
}

env_add() { printf '%s=%s\n' "$2" "$3" >>"$1"; }

# --- process identity ------------------------------------------------------------------------
# A started process is recorded as its PID and its start time (field 22 of /proc/PID/stat, in
# clock ticks since boot). The kernel sets the start time at fork and keeps it across exec, so
# the pair names one process for good: a PID that is reused later comes with another start
# time. The command line is no such name. Until the exec it is the shell's; while the kernel
# loads the new program it reads as empty (4-8 ms here when the binary is not in the page cache
# yet, as on a fresh machine's first run); redis-server blanks and rewrites it when it sets its
# process title, just before it accepts connections.
# A readiness check that read it took a live server of ours for a stranger and stopped it.
# Whether the server that answers on a port is the process we started is asked of the server
# (Redis: INFO's process_id), of the kernel (Kafka: our PID holds the listening socket) or of a
# setting only our server has (PostgreSQL: its data directory).
#
# The servers are started as `setsid PROGRAM &`. setsid forks only when it is a process group
# leader, and a background child of a non-interactive shell never is, so $! is the server's PID.

# The state and the start time of PID ("S 123456"), from one read of /proc/PID/stat, or fails.
proc_stat() {
  local line rest
  local -a f
  { line=$(<"/proc/$1/stat"); } 2>/dev/null || return 1
  # The second field is the program name in parentheses, which may itself hold ") ".
  rest=${line##*) }
  read -r -a f <<<"$rest"
  [[ ${f[19]:-} =~ ^[0-9]+$ ]] || return 1
  printf '%s %s\n' "${f[0]}" "${f[19]}"
}

# The start time of PID, or fails when there is no such process.
proc_start() {
  local st
  st=$(proc_stat "$1") || return 1
  printf '%s\n' "${st#* }"
}

# True while the process PID that started at START runs (a zombie counts as ended).
proc_alive() {
  local pid=$1 start=$2 st
  [[ $pid =~ ^[0-9]+$ && $start =~ ^[0-9]+$ ]] || return 1
  st=$(proc_stat "$pid") || return 1
  [[ ${st#* } == "$start" && ${st%% *} != [ZX] ]]
}

# Records the process just started as $! under NAME: WXG_SERVICES_<NAME>_PID=pid for readers
# and WXG_SERVICES_<NAME>_PROC=pid:start for `stop`. Prints the start time (empty when the
# process is already gone, which the readiness loop then reports).
record_proc() {
  local envf=$1 name=$2 pid=$3 start
  start=$(proc_start "$pid") || start=
  env_add "$envf" "WXG_SERVICES_${name}_PID" "$pid"
  env_add "$envf" "WXG_SERVICES_${name}_PROC" "$pid:$start"
  printf '%s\n' "$start"
}

# Seconds left before DEADLINE (epoch ms), at most CAP and at least 0.1, for `timeout`: each
# probe of a readiness loop ends by the loop's deadline.
budget() {
  local left=$(($1 - $(now_ms))) cap=$(($2 * 1000))
  ((left < cap)) || left=$cap
  ((left > 100)) || left=100
  printf '%d.%03d\n' $((left / 1000)) $((left % 1000))
}

# True when process PID holds a socket listening on 127.0.0.1:PORT. A JVM listens on an IPv6
# socket even for an IPv4 address, which /proc/net/tcp6 shows as ::ffff:127.0.0.1.
listens_on() {
  local pid=$1 port=$2 v4 v6 inode
  printf -v v4 '0100007F:%04X' "$port"
  printf -v v6 '0000000000000000FFFF00000100007F:%04X' "$port"
  while read -r inode; do
    if [[ -n $(find "/proc/$pid/fd" -maxdepth 1 -lname "socket:\\[$inode\\]" -print -quit \
      2>/dev/null) ]]; then
      return 0
    fi
  done < <(awk -v v4="$v4" -v v6="$v6" '($2 == v4 || $2 == v6) && $4 == "0A" { print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  return 1
}

# Ends one recorded process (PID started at START): SIGTERM, wait up to `grace` seconds, then
# SIGKILL. A process that is no longer the recorded one is left alone.
end_process() {
  local name=$1 pid=$2 start=$3 grace=$4 deadline
  if ! proc_alive "$pid" "$start"; then
    return 0
  fi
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$(($(now_ms) + grace * 1000))
  while proc_alive "$pid" "$start" && (($(now_ms) < deadline)); do
    sleep 0.1
  done
  if proc_alive "$pid" "$start"; then
    log "$name (pid $pid) ignored SIGTERM for ${grace}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    deadline=$(($(now_ms) + 10000))
    while proc_alive "$pid" "$start" && (($(now_ms) < deadline)); do
      sleep 0.1
    done
  fi
  if proc_alive "$pid" "$start"; then
    log "warning: $name (pid $pid) is still running"
    return 1
  fi
}

# The pid:start pairs recorded under NAME in the env file, one a line.
recorded_procs() { grep "^WXG_SERVICES_$2_PROC=" "$1" | cut -d= -f2- || true; }

# PIDs recorded under NAME by an older version of this script, without a start time: they are
# not signalled (nothing proves they are still ours), only named.
warn_unrecorded() {
  local envf=$1 name=$2 pid
  while read -r pid; do
    if ! grep -q "^WXG_SERVICES_${name}_PROC=$pid:" "$envf"; then
      log "warning: pid $pid ($name) was recorded without a start time; not stopped"
    fi
  done < <(grep "^WXG_SERVICES_${name}_PID=" "$envf" | cut -d= -f2-)
}

show_log_tail() {
  local name=$1 file=$2
  [[ -f $file ]] || return 0
  log "last lines of the $name log ($file):"
  tail -n 40 "$file" >&2 || true
}

# --- redis -----------------------------------------------------------------------------------

# The process id that the Redis server on PORT reports (INFO server), or nothing when no Redis
# server answers there by DEADLINE.
redis_pid() {
  local info
  info=$(timeout "$(budget "$2" 2)" "$redis_cli" -h 127.0.0.1 -p "$1" info server 2>/dev/null) ||
    return 0
  if [[ $info =~ process_id:([0-9]+) ]]; then
    printf '%s\n' "${BASH_REMATCH[1]}"
  fi
}

# The server and its cli: redis-server and redis-cli, or what WXG_TEST_REDIS_SERVER and
# WXG_TEST_REDIS_CLI name (scripts/test.sh's valkey phase runs the suites on valkey-server).
redis_server=${WXG_TEST_REDIS_SERVER:-redis-server}
redis_cli=${WXG_TEST_REDIS_CLI:-redis-cli}

start_redis() {
  local dir=$1 envf=$2 attempt port pid start data logf deadline answer why retry
  command -v "$redis_server" >/dev/null || die "$redis_server not found: run scripts/setup.sh"
  data=$dir/redis-data
  logf=$dir/redis.log
  rm -rf "$data"
  mkdir -p "$data"
  : >"$logf"
  for attempt in 1 2 3; do
    port=$(pick_port) || die "no free port for redis-server"
    setsid "$redis_server" --port "$port" --bind 127.0.0.1 --dir "$data" --save '' \
      --appendonly no --daemonize no </dev/null >>"$logf" 2>&1 &
    pid=$!
    start=$(record_proc "$envf" REDIS "$pid")
    deadline=$(($(now_ms) + 20000 * scale))
    why="did not answer within $((20 * scale)) s"
    retry=0
    while :; do
      if ! proc_alive "$pid" "$start"; then
        why="exited before it answered"
        break
      fi
      answer=$(redis_pid "$port" "$deadline")
      if [[ $answer == "$pid" ]]; then
        env_add "$envf" WXG_SERVICES_REDIS_DATA "$data"
        env_add "$envf" WXG_SERVICES_REDIS_LOG "$logf"
        env_add "$envf" WXG_TEST_REDIS_HOST 127.0.0.1
        env_add "$envf" WXG_TEST_REDIS_PORT "$port"
        log "redis-server ready on 127.0.0.1:$port (pid $pid)"
        return 0
      fi
      if [[ -n $answer ]]; then
        why="port $port is served by another Redis (pid $answer)"
        retry=1
        break
      fi
      (($(now_ms) < deadline)) || break
      sleep 0.05
    done
    end_process redis-server "$pid" "$start" 5 || true
    if ((retry)) || grep -q 'Address already in use' "$logf" 2>/dev/null; then
      log "port $port was taken meanwhile; trying another (attempt $attempt)"
      continue
    fi
    break
  done
  show_log_tail redis-server "$logf"
  die "redis-server (pid $pid) $why"
}

# --- kafka -----------------------------------------------------------------------------------

# The broker listens four times on 127.0.0.1: PLAINTEXT (most tests), CONTROLLER (KRaft), SASL
# (SASL_PLAINTEXT) and SASLSSL (SASL_SSL with the certificate make_kafka_tls wrote). The two SASL
# listeners take one user, with one password, by two mechanisms: PLAIN (the user is in the JAAS
# line) and SCRAM-SHA-256 (the storage format created the credential). SCRAM is there for
# clients that can speak it to Kafka 4: librdkafka before 2.6.1, Debian 12's 2.0.2 among them,
# repeats the client nonce in its final SCRAM message, and Kafka 4 refuses that proof as
# invalid credentials; so the tests use PLAIN, which over SASL_SSL is what managed Kafka
# services commonly offer. Brokers and controller talk over the plain listeners.
write_kafka_config() {
  local kdir=$1 port=$2 cport=$3 sport=$4 tport=$5 kspass=$6 user=$7 password=$8
  local scram='org.apache.kafka.common.security.scram.ScramLoginModule required;'
  local plain="org.apache.kafka.common.security.plain.PlainLoginModule required"
  plain+=" user_$user=\"$password\";"
  cat >"$kdir/server.properties" <<EOF
# Single-node KRaft broker for tests: broker and controller in one JVM, static quorum.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,\\
  SASL://127.0.0.1:$sport,SASLSSL://127.0.0.1:$tport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL://127.0.0.1:$sport,\\
  SASLSSL://127.0.0.1:$tport
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT,\\
  SASLSSL:SASL_SSL
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256
listener.name.sasl.plain.sasl.jaas.config=$plain
listener.name.sasl.scram-sha-256.sasl.jaas.config=$scram
listener.name.saslssl.plain.sasl.jaas.config=$plain
listener.name.saslssl.scram-sha-256.sasl.jaas.config=$scram
listener.name.saslssl.ssl.keystore.type=PKCS12
listener.name.saslssl.ssl.keystore.location=$kdir/tls/broker.p12
listener.name.saslssl.ssl.keystore.password=$kspass
log.dirs=$kdir/data
# One node: internal topics must not ask for three replicas.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
# Fast tests: no initial rebalance delay, one partition for internal topics, short sessions.
group.initial.rebalance.delay.ms=0
offsets.topic.num.partitions=1
transaction.state.log.num.partitions=1
num.partitions=1
auto.create.topics.enable=true
group.min.session.timeout.ms=1000
# Small footprint on a 2-core machine; the cleaner's dedupe buffer lives on the heap.
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
log.cleaner.dedupe.buffer.size=16777216
EOF
  cat >"$kdir/log4j2.properties" <<'EOF'
status = warn
name = wxguard-test-broker
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.stderr.ref = STDERR
logger.kafka.name = kafka
logger.kafka.level = warn
logger.oak.name = org.apache.kafka
logger.oak.level = warn
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
logger.state.name = state.change.logger
logger.state.level = warn
EOF
}

# N random hex digits.
random_hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n' | head -c "$1"; }

# A CA and a broker certificate signed by it for 127.0.0.1, in KDIR/tls: ca.pem (what clients
# trust, as ssl.ca.location) and broker.p12 (the broker's key and chain, a PKCS#12 keystore
# locked with KSPASS). P-256 keys: made in milliseconds. The CA key is deleted once it signed.
make_kafka_tls() {
  local kdir=$1 kspass=$2 t=$1/tls
  mkdir -p "$t"
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$t/ca.key" -out "$t/ca.pem" -days 30 -subj "/CN=wxguard test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
      -keyout "$t/broker.key" -out "$t/broker.csr" -subj "/CN=127.0.0.1" &&
    printf '%s\n' 'subjectAltName=IP:127.0.0.1,DNS:localhost' 'extendedKeyUsage=serverAuth' \
      'keyUsage=critical,digitalSignature' >"$t/broker.ext" &&
    openssl x509 -req -in "$t/broker.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" \
      -set_serial "0x$(random_hex 16)" -days 30 -extfile "$t/broker.ext" -out "$t/broker.pem" &&
    openssl pkcs12 -export -in "$t/broker.pem" -inkey "$t/broker.key" -certfile "$t/ca.pem" \
      -name broker -out "$t/broker.p12" -passout "pass:$kspass" &&
    rm -f "$t/ca.key" "$t/broker.csr" "$t/broker.ext"
}

# A random cluster id: 16 random bytes in unpadded base64url, as Kafka's Uuid writes them.
cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [[ $id != -* ]] && break
  done
  printf '%s\n' "$id"
}

# True when the broker on PORT answers a metadata request, by DEADLINE, with one broker; more
# arguments are client settings (-X key=value) for the listener's security protocol. What the
# client said of the last failed probe is in $kafka_probe_log, shown when the start fails.
kafka_probe_log=/dev/null
kafka_ready() {
  local port=$1 deadline=$2 out
  shift 2
  out=$(timeout "$(budget "$deadline" 10)" kcat -L -b "127.0.0.1:$port" -m 2 \
    -X broker.address.family=v4 "$@" 2>"$kafka_probe_log") || return 1
  [[ $out == *" 1 brokers:"* ]]
}

start_kafka() {
  local dir=$1 envf=$2 kdir logf attempt port cport sport tport pid='' start t0 t1 deadline jvm
  local why="found no four free ports" user=wxgtest password kspass
  local -a sasl
  command -v java >/dev/null || die "java not found: run scripts/setup.sh"
  command -v kcat >/dev/null || die "kcat not found: run scripts/setup.sh"
  command -v openssl >/dev/null || die "openssl not found: run scripts/setup.sh"
  # Fresh secrets for every run: the SASL password the tests read from the env file, and the
  # keystore's, which only the broker's configuration holds.
  password=$(random_hex 24)
  kspass=$(random_hex 24)
  sasl=(-X sasl.mechanisms=PLAIN -X "sasl.username=$user" -X "sasl.password=$password")
  if ! compgen -G "$kafka_libs/kafka_2.13-*.jar" >/dev/null; then
    die "no Kafka jars in $kafka_libs: run scripts/setup.sh (or set WXG_CACHE_DIR)"
  fi
  kdir=$dir/kafka
  logf=$dir/kafka.log
  kafka_probe_log=$dir/kafka-probe.log
  # -XX:TieredStopAtLevel=1 and SerialGC cut start-up work and footprint (fine for tests, not
  # for benchmarks); -XX:-UsePerfData keeps the JVM from writing to /tmp.
  jvm=(-Xms64m "-Xmx${WXG_KAFKA_HEAP:-512m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1
    -XX:+ExitOnOutOfMemoryError -XX:-UsePerfData -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$kdir/log4j2.properties" "-Djava.io.tmpdir=$kdir/tmp")
  for attempt in 1 2 3; do
    rm -rf "$kdir"
    mkdir -p "$kdir/data" "$kdir/tmp"
    port=$(pick_port) || die "no free port for Kafka"
    cport=$(pick_port) || die "no free port for the Kafka controller"
    sport=$(pick_port) || die "no free port for Kafka's SASL listener"
    tport=$(pick_port) || die "no free port for Kafka's SASL_SSL listener"
    [[ $(printf '%s\n' "$port" "$cport" "$sport" "$tport" | sort -u | wc -l) == 4 ]] || continue
    t0=$(now_ms)
    make_kafka_tls "$kdir" "$kspass" >"$dir/kafka-tls.log" 2>&1 || {
      show_log_tail "openssl" "$dir/kafka-tls.log"
      die "making the Kafka broker's certificate failed"
    }
    write_kafka_config "$kdir" "$port" "$cport" "$sport" "$tport" "$kspass" "$user" "$password"
    # A fresh directory is formatted once with a new cluster id (static quorum: no --standalone)
    # and the SCRAM user in its first metadata, so that it exists when the listeners open.
    if ! java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData \
      "-Dlog4j2.configurationFile=$kdir/log4j2.properties" -cp "$kafka_libs/*" \
      kafka.tools.StorageTool format "--cluster-id=$(cluster_id)" \
      --add-scram "SCRAM-SHA-256=[name=$user,password=$password]" \
      --config "$kdir/server.properties" </dev/null >"$dir/kafka-format.log" 2>&1; then
      show_log_tail "Kafka storage format" "$dir/kafka-format.log"
      die "formatting the Kafka data directory failed"
    fi
    t1=$(now_ms)
    : >"$logf"
    setsid java "${jvm[@]}" -cp "$kafka_libs/*" kafka.Kafka "$kdir/server.properties" \
      </dev/null >>"$logf" 2>&1 &
    pid=$!
    start=$(record_proc "$envf" KAFKA "$pid")
    env_add "$envf" WXG_SERVICES_KAFKA_DATA "$kdir"
    deadline=$(($(now_ms) + 90000 * scale))
    why="did not become ready within $((90 * scale)) s"
    while :; do
      if ! proc_alive "$pid" "$start"; then
        why="exited before it was ready"
        break
      fi
      # The metadata answer counts only when our JVM holds the port: a broker of another run
      # that took it meanwhile would answer just the same.
      if kafka_ready "$port" "$deadline" && listens_on "$pid" "$port" &&
        kafka_ready "$sport" "$deadline" "${sasl[@]}" -X security.protocol=SASL_PLAINTEXT &&
        kafka_ready "$tport" "$deadline" "${sasl[@]}" -X security.protocol=SASL_SSL \
          -X "ssl.ca.location=$kdir/tls/ca.pem"; then
        env_add "$envf" WXG_SERVICES_KAFKA_LOG "$logf"
        env_add "$envf" WXG_SERVICES_KAFKA_CONTROLLER_PORT "$cport"
        env_add "$envf" WXG_TEST_KAFKA_BOOTSTRAP "127.0.0.1:$port"
        env_add "$envf" WXG_TEST_KAFKA_SASL_BOOTSTRAP "127.0.0.1:$sport"
        env_add "$envf" WXG_TEST_KAFKA_SSL_BOOTSTRAP "127.0.0.1:$tport"
        env_add "$envf" WXG_TEST_KAFKA_CA "$kdir/tls/ca.pem"
        env_add "$envf" WXG_TEST_KAFKA_SASL_MECHANISM PLAIN
        env_add "$envf" WXG_TEST_KAFKA_SASL_USER "$user"
        env_add "$envf" WXG_TEST_KAFKA_SASL_PASSWORD "$password"
        log "Kafka broker ready on 127.0.0.1:$port, SASL_PLAINTEXT on $sport, SASL_SSL on" \
          "$tport (pid $pid, controller port $cport; certificate and format $((t1 - t0)) ms," \
          "start $(($(now_ms) - t1)) ms)"
        return 0
      fi
      (($(now_ms) < deadline)) || break
      sleep 0.25
    done
    end_process "Kafka broker" "$pid" "$start" 20 || true
    if grep -q 'Address already in use' "$logf" 2>/dev/null; then
      log "a port was taken meanwhile; trying other ports (attempt $attempt)"
      continue
    fi
    break
  done
  show_log_tail "Kafka broker" "$logf"
  show_log_tail "last readiness probe" "$kafka_probe_log"
  die "the Kafka broker (pid $pid) $why"
}

# --- postgresql ------------------------------------------------------------------------------
# A throw-away cluster for the database plugins. Debian's initdb and postgres refuse to run as
# root, so the cluster belongs to the unprivileged `postgres` account (WXG_PG_USER overrides it)
# and lives in a temporary directory that this account owns: the build tree may sit below
# directories it cannot enter. The Unix socket goes into that directory too, never into the
# system's /run/postgresql. fsync and synchronous_commit are off: a test cluster need not
# survive a power cut, and every write is much cheaper without them. Clients reach it over TCP
# on 127.0.0.1 with trust authentication (loopback only, a throw-away cluster).

pg_bindir() {
  local d
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
    dirname "$(command -v initdb)"
    return 0
  fi
  for d in $(compgen -G '/usr/lib/postgresql/*/bin' | sort -t/ -k4 -n -r); do
    if [[ -x $d/initdb && -x $d/postgres ]]; then
      printf '%s\n' "$d"
      return 0
    fi
  done
  return 1
}

pg_as() { runuser -u "${WXG_PG_USER:-postgres}" -- "$@"; }

# The data directory of the PostgreSQL server on PORT, or nothing when none answers by DEADLINE.
# Our cluster's directory is a fresh mktemp name, so it tells our server from any other.
pg_data_dir() {
  PGCONNECT_TIMEOUT=2 timeout "$(budget "$2" 5)" psql -h 127.0.0.1 -p "$1" \
    -U "${WXG_PG_USER:-postgres}" -d postgres -Atqc 'show data_directory' 2>/dev/null || true
}

start_postgres() {
  local dir=$1 envf=$2 bindir pgdir logf attempt port pid start deadline answer why retry
  local user=${WXG_PG_USER:-postgres}
  bindir=$(pg_bindir) || die "PostgreSQL's initdb not found: run scripts/setup.sh"
  command -v psql >/dev/null || die "psql not found: run scripts/setup.sh"
  id -u "$user" >/dev/null 2>&1 || die "no '$user' account to run PostgreSQL as"
  pgdir=$(mktemp -d "${TMPDIR:-/tmp}/wxg-pg.XXXXXX") || die "cannot create a temporary directory"
  env_add "$envf" WXG_SERVICES_PG_DIR "$pgdir"
  chown "$user:" "$pgdir"
  chmod 0700 "$pgdir"
  logf=$dir/postgres.log
  : >"$logf"
  if ! pg_as "$bindir/initdb" -D "$pgdir/data" -U "$user" --auth=trust --encoding=UTF8 \
    --locale=C.UTF-8 --no-sync </dev/null >"$dir/postgres-initdb.log" 2>&1; then
    show_log_tail "initdb" "$dir/postgres-initdb.log"
    die "initdb failed"
  fi
  for attempt in 1 2 3; do
    port=$(pick_port) || die "no free port for PostgreSQL"
    # The server runs in the foreground of its own session (like redis-server above), so that
    # its PID is ours to record and stop; its log goes to a file the postgres account can write.
    setsid runuser -u "$user" -- "$bindir/postgres" -D "$pgdir/data" -p "$port" \
      -c listen_addresses=127.0.0.1 -c "unix_socket_directories=$pgdir" -c fsync=off \
      -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 \
      -c shared_buffers=64MB </dev/null >>"$logf" 2>&1 &
    pid=$!
    start=$(record_proc "$envf" PG "$pid")
    deadline=$(($(now_ms) + 30000 * scale))
    why="did not answer within $((30 * scale)) s"
    retry=0
    while :; do
      if ! proc_alive "$pid" "$start"; then
        why="exited before it answered"
        break
      fi
      answer=$(pg_data_dir "$port" "$deadline")
      if [[ $answer == "$pgdir/data" ]]; then
        env_add "$envf" WXG_SERVICES_PG_LOG "$logf"
        env_add "$envf" WXG_TEST_PG_DSN \
          "postgresql://$user@127.0.0.1:$port/postgres?connect_timeout=5"
        log "PostgreSQL ready on 127.0.0.1:$port (pid $pid, data in $pgdir)"
        return 0
      fi
      if [[ -n $answer ]]; then
        why="port $port is served by another PostgreSQL (data in $answer)"
        retry=1
        break
      fi
      (($(now_ms) < deadline)) || break
      sleep 0.1
    done
    stop_postgres_proc "$pid" "$start" || true
    if ((retry)) || grep -q 'could not bind\|Address already in use' "$logf" 2>/dev/null; then
      log "port $port was taken meanwhile; trying another (attempt $attempt)"
      continue
    fi
    break
  done
  show_log_tail PostgreSQL "$logf"
  die "PostgreSQL (pid $pid) $why"
}

# The recorded PID is runuser's; the postmaster is its child. SIGTERM to runuser is passed on to
# the postmaster (smart shutdown would wait for clients, so the postmaster itself gets SIGINT:
# fast shutdown). The children of the recorded runuser are ours by descent, whatever their
# command lines say at this moment.
stop_postgres_proc() {
  local pid=$1 start=$2 child children=()
  proc_alive "$pid" "$start" || return 0
  read -r -a children <"/proc/$pid/task/$pid/children" 2>/dev/null || true
  for child in "${children[@]}"; do
    kill -INT "$child" 2>/dev/null || true
  done
  end_process PostgreSQL "$pid" "$start" 20
}

stop_postgres() {
  local envf=$1 proc pgdir rc=0
  while read -r proc; do
    [[ -n $proc ]] || continue
    stop_postgres_proc "${proc%%:*}" "${proc#*:}" || rc=1
  done < <(recorded_procs "$envf" PG)
  warn_unrecorded "$envf" PG
  if ((rc == 0)); then
    while read -r pgdir; do
      # Only a directory this script made: the mktemp pattern under the temporary directory.
      if [[ $pgdir == */wxg-pg.* && -d $pgdir ]]; then
        rm -rf "$pgdir"
      fi
    done < <(grep '^WXG_SERVICES_PG_DIR=' "$envf" | cut -d= -f2-)
  fi
  return "$rc"
}

# --- commands --------------------------------------------------------------------------------

cmd_stop() {
  local dir=$1 rc=0 proc data
  local envf=$dir/services.env
  if [[ ! -f $envf ]]; then
    log "nothing recorded in $dir; nothing to stop"
    return 0
  fi
  # Kafka first: its shutdown is the slow part, and nothing in it depends on Redis.
  while read -r proc; do
    [[ -n $proc ]] || continue
    end_process "Kafka broker" "${proc%%:*}" "${proc#*:}" 30 || rc=1
  done < <(recorded_procs "$envf" KAFKA)
  warn_unrecorded "$envf" KAFKA
  while read -r proc; do
    [[ -n $proc ]] || continue
    end_process redis-server "${proc%%:*}" "${proc#*:}" 10 || rc=1
  done < <(recorded_procs "$envf" REDIS)
  warn_unrecorded "$envf" REDIS
  stop_postgres "$envf" || rc=1
  if ((rc == 0)); then
    for data in "$dir/kafka" "$dir/redis-data"; do
      rm -rf "$data"
    done
    rm -f "$envf"
    log "stopped; logs kept in $dir"
  else
    log "some processes did not stop; $envf kept so that stop can be run again"
  fi
  return "$rc"
}

started_dir=
start_done=0
on_start_exit() {
  local rc=$?
  if ((start_done == 0)) && [[ -n $started_dir ]]; then
    log "start failed or was interrupted; stopping what it started"
    cmd_stop "$started_dir" || true
  fi
  exit "$rc"
}

cmd_start() {
  local dir=$1 only=$2 envf=$1/services.env
  # Servers left behind by an interrupted earlier run are stopped first: every run starts clean.
  if [[ -f $envf ]]; then
    log "found $envf from an earlier run; stopping what it recorded"
    cmd_stop "$dir" || die "could not stop the servers of an earlier run"
  fi
  # The env file grows as processes start, so that an interrupted or failed start can still be
  # cleaned up by `stop`; the trap does that here. Read it only after `start` returned.
  printf '# written by scripts/services.sh start; removed by stop\n' >"$envf"
  started_dir=$dir
  trap on_start_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  env_add "$envf" WXG_SERVICES_DIR "$dir"
  if [[ $only == all || $only == redis ]]; then
    start_redis "$dir" "$envf"
  fi
  if [[ $only == all || $only == kafka ]]; then
    start_kafka "$dir" "$envf"
  fi
  if [[ $only == all || $only == postgres ]]; then
    start_postgres "$dir" "$envf"
  fi
  start_done=1
  log "addresses written to $envf"
}

# Reports each server: the last process recorded under its name (earlier ones are attempts
# that failed to bind) and where it listens.
cmd_status() {
  local dir=$1 envf=$1/services.env name label where proc rc=0
  [[ -f $envf ]] || {
    log "not started ($envf missing)"
    return 1
  }
  for name in REDIS PG KAFKA; do
    case $name in
    REDIS) label=redis-server where="port $(env_get "$envf" WXG_TEST_REDIS_PORT)" ;;
    PG) label=PostgreSQL where=$(env_get "$envf" WXG_TEST_PG_DSN) ;;
    KAFKA) label=Kafka where=$(env_get "$envf" WXG_TEST_KAFKA_BOOTSTRAP) ;;
    esac
    proc=$(recorded_procs "$envf" "$name" | tail -n 1)
    [[ -n $proc ]] || continue
    if proc_alive "${proc%%:*}" "${proc#*:}"; then
      log "$label pid ${proc%%:*} ($where): running"
    else
      log "$label pid ${proc%%:*}: not running"
      rc=1
    fi
  done
  return "$rc"
}

main() {
  (($# >= 2)) || usage
  local cmd=$1 dir=$2 only=all
  shift 2
  while (($#)); do
    case $1 in
    --only)
      (($# >= 2)) || usage
      only=$2
      shift 2
      ;;
    *) usage ;;
    esac
  done
  [[ $only == all || $only == redis || $only == kafka || $only == postgres ]] || usage
  if [[ $cmd == start ]]; then
    mkdir -p "$dir"
  fi
  if [[ -d $dir ]]; then
    dir=$(cd "$dir" && pwd)
  fi
  case $cmd in
  start) cmd_start "$dir" "$only" ;;
  stop) cmd_stop "$dir" ;;
  status) cmd_status "$dir" ;;
  *) usage ;;
  esac
}

main "$@"
