# Sourced by start-redis.sh and start-sentinel.sh: the pods' addresses.
#
# domain: the pods' DNS domain (the headless Service); nodes and sentinels: every pod's
# Redis and Sentinel as host:port, in Kubernetes the pods' stable names. The environment
# may name them instead (REDIS_NODES, SENTINEL_NODES: the tests run the scripts against
# valkey servers and sentinels on loopback ports).
set_name="${STATEFULSET_NAME:-vmpool-redis}"
domain="${set_name}-headless.${POD_NAMESPACE:-default}.svc.${CLUSTER_DOMAIN:-cluster.local}"
every() {  # every pod's address on port $1
  i=0
  while [ "${i}" -lt "${REDIS_PODS:-3}" ]; do
    printf '%s ' "${set_name}-${i}.${domain}:$1"
    i=$((i + 1))
  done
}
nodes="${REDIS_NODES:-$(every 6379)}"
sentinels="${SENTINEL_NODES:-$(every 26379)}"
