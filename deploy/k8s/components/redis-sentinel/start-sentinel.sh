#!/bin/sh
# Start this pod's Sentinel. Its state (the primary it follows, the replicas and
# sentinels it knows) is kept on the pod's volume, so that a restart remembers a
# failover; the passwords are written afresh at every start (a rotated Secret wins).
set -eu
domain="vmpool-redis-headless.${POD_NAMESPACE}.svc.${CLUSTER_DOMAIN}"
self="${POD_NAME}.${domain}"
conf=/data/sentinel/sentinel.conf
mkdir -p /data/sentinel
if [ ! -s "${conf}" ]; then
  primary=""
  if answer=$(REDISCLI_AUTH="${SENTINEL_PASSWORD}" redis-cli -h "vmpool-redis-sentinel.${POD_NAMESPACE}.svc.${CLUSTER_DOMAIN}" \
      -p 26379 sentinel get-master-addr-by-name "${SENTINEL_MASTER}" 2>/dev/null); then
    primary=$(echo "${answer}" | sed -n 1p)
  fi
  [ -n "${primary}" ] || primary="vmpool-redis-0.${domain}"
  cat > "${conf}" <<CONF
port 26379
dir /data/sentinel
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel monitor ${SENTINEL_MASTER} ${primary} 6379 2
sentinel down-after-milliseconds ${SENTINEL_MASTER} 5000
sentinel failover-timeout ${SENTINEL_MASTER} 60000
sentinel parallel-syncs ${SENTINEL_MASTER} 1
CONF
fi
grep -v -e '^sentinel auth-pass ' -e '^requirepass ' -e '^sentinel announce-ip ' "${conf}" > "${conf}.new"
{
  echo "sentinel announce-ip ${self}"
  echo "sentinel auth-pass ${SENTINEL_MASTER} ${REDIS_PASSWORD}"
  echo "requirepass ${SENTINEL_PASSWORD}"
} >> "${conf}.new"
mv "${conf}.new" "${conf}"
exec redis-server "${conf}" --sentinel
