#!/bin/sh
# Start this pod's Sentinel. Its state (the primary it follows, the replicas and
# sentinels it knows) is kept on the pod's volume, so that a restart remembers a
# failover; the passwords are written afresh at every start (a rotated Secret wins).
#
# A sentinel without state (a first start, a lost volume) follows the primary the other
# sentinels name, each asked by its pod's name. Only when none answers within
# SENTINEL_BOOTSTRAP_WAIT seconds (a first-ever start: no sentinel has state yet) does it
# follow the first pod; even then start-redis.sh starts no empty Redis as the primary
# while another pod holds data, and the sentinels' gossip moves a stray one to the
# primary the others know.
#
# Addresses are host:port, in Kubernetes the pods' stable names; the environment may
# name them instead (SENTINEL_SELF, REDIS_NODES, SENTINEL_NODES: the tests run this on
# loopback ports).
set -eu
. "$(dirname "$0")/addresses.sh"  # domain, nodes, sentinels
self="${SENTINEL_SELF:-${POD_NAME:-}.${domain}:26379}"
conf="${SENTINEL_CONF:-/data/sentinel/sentinel.conf}"
mkdir -p "$(dirname "${conf}")"

named_primary() {  # "host port" of the primary another sentinel names, or nothing
  for sentinel in ${sentinels}; do
    [ "${sentinel}" = "${self}" ] && continue
    answer=$(REDISCLI_AUTH="${SENTINEL_PASSWORD}" timeout 3 redis-cli -h "${sentinel%:*}" \
      -p "${sentinel##*:}" --raw sentinel get-master-addr-by-name "${SENTINEL_MASTER}" \
      2>/dev/null) || continue
    port=$(echo "${answer}" | sed -n 2p)
    case "${port}" in '' | *[!0-9]*) continue ;; esac
    echo "$(echo "${answer}" | sed -n 1p) ${port}"
    return
  done
}

if [ ! -s "${conf}" ]; then
  deadline=$(($(date +%s) + ${SENTINEL_BOOTSTRAP_WAIT:-30}))
  primary=$(named_primary)
  while [ -z "${primary}" ] && [ "$(date +%s)" -lt "${deadline}" ]; do
    sleep 1
    primary=$(named_primary)
  done
  if [ -z "${primary}" ]; then
    first=${nodes%% *}
    primary="${first%:*} ${first##*:}"
    echo "start-sentinel: no sentinel answered: a first start, following ${primary}" >&2
  fi
  cat >"${conf}" <<CONF
port ${self##*:}
dir $(dirname "${conf}")
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel monitor ${SENTINEL_MASTER} ${primary} ${SENTINEL_QUORUM:-2}
sentinel down-after-milliseconds ${SENTINEL_MASTER} ${SENTINEL_DOWN_AFTER_MS:-5000}
sentinel failover-timeout ${SENTINEL_MASTER} ${SENTINEL_FAILOVER_TIMEOUT_MS:-60000}
sentinel parallel-syncs ${SENTINEL_MASTER} 1
CONF
fi
grep -v -e '^sentinel auth-pass ' -e '^requirepass ' -e '^sentinel announce-ip ' "${conf}" \
  >"${conf}.new"
{
  echo "sentinel announce-ip ${self%:*}"
  echo "sentinel auth-pass ${SENTINEL_MASTER} ${REDIS_PASSWORD}"
  echo "requirepass ${SENTINEL_PASSWORD}"
} >>"${conf}.new"
mv "${conf}.new" "${conf}"
# SENTINEL_ARGS: more arguments, split on spaces (the tests' --bind, --logfile).
# shellcheck disable=SC2086
exec "${REDIS_SERVER:-redis-server}" "${conf}" --sentinel ${SENTINEL_ARGS:-}
