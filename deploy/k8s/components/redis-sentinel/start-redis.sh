#!/bin/sh
# Start this pod's Redis as the primary, or as a replica of the current primary.
# The primary is what the sentinels say; when none answers (a first start, or every pod
# restarting at once), what this pod's sentinel last recorded on the volume; else
# vmpool-redis-0. Every address is the pod's stable DNS name (the headless Service).
set -eu
domain="vmpool-redis-headless.${POD_NAMESPACE}.svc.${CLUSTER_DOMAIN}"
self="${POD_NAME}.${domain}"
primary=""
if answer=$(REDISCLI_AUTH="${SENTINEL_PASSWORD}" redis-cli -h "vmpool-redis-sentinel.${POD_NAMESPACE}.svc.${CLUSTER_DOMAIN}" \
    -p 26379 sentinel get-master-addr-by-name "${SENTINEL_MASTER}" 2>/dev/null); then
  primary=$(echo "${answer}" | sed -n 1p)
fi
if [ -z "${primary}" ] && [ -s /data/sentinel/sentinel.conf ]; then
  primary=$(awk -v m="${SENTINEL_MASTER}" '$1 == "sentinel" && $2 == "monitor" && $3 == m { print $4 }' \
    /data/sentinel/sentinel.conf)
fi
[ -n "${primary}" ] || primary="vmpool-redis-0.${domain}"
set -- /etc/redis/redis.conf --requirepass "${REDIS_PASSWORD}" --masterauth "${REDIS_PASSWORD}" \
  --maxmemory "${REDIS_MAXMEMORY}" --replica-announce-ip "${self}"
if [ "${primary}" != "${self}" ]; then
  set -- "$@" --replicaof "${primary}" 6379
fi
exec redis-server "$@"
