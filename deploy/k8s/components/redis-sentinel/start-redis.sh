#!/bin/sh
# Start this pod's Redis as a replica of the current primary, or as the primary.
#
# The primary is the one a majority of the sentinels name (SENTINEL_QUORUM of them),
# each pod's sentinel asked by its pod's name (the sentinels' Service answers only for
# ready pods). When they name another pod, this one starts as its replica. When they
# name this one:
# - with data on its volume, it starts as the primary (a restart);
# - with an empty volume it never does on its own: it waits, its Redis not running, so
#   that the sentinels take it for down and promote a replica that has the data; then it
#   joins that one. Only a first-ever start (every other pod's Redis answers and holds
#   no key: nothing can be lost) starts empty as the primary, or an operator's word:
#   the file bootstrap-primary on the volume (docs/operations.md, "Redis Sentinel").
# When no majority answers for START_WAIT seconds (every pod restarting at once), a pod
# with data follows what its own sentinel last recorded on the volume; an empty one
# goes on waiting. Never the first pod by default.
#
# Addresses are host:port, in Kubernetes the pods' stable names (the headless Service);
# the environment may name them instead (REDIS_SELF, REDIS_NODES, SENTINEL_NODES: the
# tests run this script against valkey servers and sentinels on loopback ports).
set -eu
. "$(dirname "$0")/addresses.sh"  # domain, nodes, sentinels
self="${REDIS_SELF:-${POD_NAME:-}.${domain}:6379}"
data="${REDIS_DATA_DIR:-/data}"
sentinel_conf="${SENTINEL_CONF:-${data}/sentinel/sentinel.conf}"

cli() {  # cli ADDRESS PASSWORD COMMAND...: the raw reply, at most 3 s; fails unanswered
  address=$1 password=$2
  shift 2
  REDISCLI_AUTH="${password}" timeout 3 redis-cli -h "${address%:*}" -p "${address##*:}" \
    --raw "$@" 2>/dev/null
}

named_primary() {  # the primary (host:port) a majority of the sentinels name, or nothing
  for sentinel in ${sentinels}; do
    answer=$(cli "${sentinel}" "${SENTINEL_PASSWORD:-}" \
      sentinel get-master-addr-by-name "${SENTINEL_MASTER}") || continue
    port=$(echo "${answer}" | sed -n 2p)
    case "${port}" in '' | *[!0-9]*) continue ;; esac
    echo "$(echo "${answer}" | sed -n 1p):${port}"
  done | sort | uniq -c | awk -v q="${SENTINEL_QUORUM:-2}" '$1 >= q { print $2; exit }'
}

has_data() {  # whether this pod's volume holds Redis data (an AOF or a snapshot)
  [ -s "${data}/dump.rdb" ] || [ -n "$(ls -A "${data}/appendonlydir" 2>/dev/null)" ]
}

peers_hold_nothing() {  # every other pod's Redis answers, and holds no key
  for node in ${nodes}; do
    [ "${node}" = "${self}" ] && continue
    info=$(cli "${node}" "${REDIS_PASSWORD}" info keyspace) || return 1
    case "${info}" in *'# Keyspace'*) ;; *) return 1 ;; esac  # LOADING, NOAUTH: unknown
    if echo "${info}" | grep -q '^db'; then return 1; fi
  done
}

recorded_primary() {  # what this pod's sentinel last recorded on the volume
  if [ -s "${sentinel_conf}" ]; then
    awk -v m="${SENTINEL_MASTER}" \
      '$1 == "sentinel" && $2 == "monitor" && $3 == m { print $4 ":" $5 }' "${sentinel_conf}"
  fi
}

since=$(date +%s)
while :; do
  primary=$(named_primary)
  waited=$(($(date +%s) - since))
  if [ -z "${primary}" ] && has_data && [ "${waited}" -ge "${START_WAIT:-60}" ]; then
    primary=$(recorded_primary)
  fi
  if [ -n "${primary}" ] && [ "${primary}" != "${self}" ]; then
    echo "start-redis: a replica of ${primary}" >&2
    break
  fi
  if [ "${primary}" = "${self}" ] && has_data; then
    echo "start-redis: the primary, on the data of its volume" >&2
    break
  fi
  if [ "${primary}" = "${self}" ] && peers_hold_nothing; then
    echo "start-redis: the primary of a first start (no pod holds a key)" >&2
    break
  fi
  if [ -e "${data}/bootstrap-primary" ]; then
    rm -f "${data}/bootstrap-primary"
    primary="${self}"
    echo "start-redis: the primary, as ${data}/bootstrap-primary said" >&2
    break
  fi
  echo "start-redis: waiting (${waited} s): the sentinels name ${primary:-no primary};" \
    "an empty volume does not start as the primary while another pod may hold the data" >&2
  sleep "${POLL_INTERVAL:-2}"
done

set -- "${REDIS_CONF:-/etc/redis/redis.conf}" --requirepass "${REDIS_PASSWORD}" \
  --masterauth "${REDIS_PASSWORD}" --maxmemory "${REDIS_MAXMEMORY}" \
  --replica-announce-ip "${self%:*}" \
  --min-replicas-to-write "${MIN_REPLICAS_TO_WRITE:-1}" \
  --min-replicas-max-lag "${MIN_REPLICAS_MAX_LAG:-10}"
if [ "${primary}" != "${self}" ]; then
  set -- "$@" --replicaof "${primary%:*}" "${primary##*:}"
fi
# REDIS_ARGS: more arguments, split on spaces (the tests' --bind, --port, --dir).
# shellcheck disable=SC2086
exec "${REDIS_SERVER:-redis-server}" "$@" ${REDIS_ARGS:-}
