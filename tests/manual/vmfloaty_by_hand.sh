#!/usr/bin/env bash
# Runs real vmfloaty (puppetlabs/vmfloaty) against `vmpool up` from this worktree, every
# vmfloaty command vmpool supports, and prints each command with its output. By hand only: CI
# does not need Ruby.
#
# Needs: Debian's `ruby ruby-faraday ruby-commander`; vmfloaty's source in $VMFLOATY
# (default /tmp/vmfloaty: `git archive` of github:puppetlabs/vmfloaty).
# Usage: tests/manual/vmfloaty_by_hand.sh [PORT]
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
VMFLOATY=${VMFLOATY:-/tmp/vmfloaty}
PORT=${1:-18080}
WORK=$(mktemp -d)
VMPOOL="$ROOT/.venv/bin/vmpool"

cat > "$WORK/vmpool.yaml" <<YAML
:providers:
  simulated: {boot_seconds: [1, 2], seed: 12}
:auth: {provider: dummy}
:config: {vm_lifetime: 2, vm_lifetime_auth: 4, max_lifetime_upper_limit: 48, experimental_features: true}
:schedule: {top_up_pools: 1, check_ready: 30}
:pools:
  - {name: debian-12, alias: [debian], size: 3, domain: example.com}
  - {name: centos-9, alias: [centos], size: 2, domain: example.com}
YAML

"$VMPOOL" up --config "$WORK/vmpool.yaml" --port "$PORT" --workers 2 > "$WORK/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 1 120); do
  grep -q "redis://" "$WORK/up.log" && break
  sleep 0.5
done
REDIS=$(grep -o 'redis://[^ ]*' "$WORK/up.log" | head -1)
[ -n "$REDIS" ] || { cat "$WORK/up.log"; exit 1; }
TOKEN=$("$VMPOOL" token create jdoe --config "$WORK/vmpool.yaml" --redis-url "$REDIS" | tail -1)
mkdir -p "$WORK/home"
cat > "$WORK/home/.vmfloaty.yml" <<YAML
user: jdoe
services:
  vmpool:
    type: vmpooler
    url: http://127.0.0.1:$PORT/api/v3
    token: $TOKEN
YAML

floaty() {
  echo "\$ floaty $*"
  (cd "$VMFLOATY" && HOME="$WORK/home" timeout 120 ruby -I lib bin/floaty "$@" < /dev/null 2>&1)
  echo "[exit $?]"
  echo
}

# wait for the warm pools to fill (top-up every second, boots of 1-2 s)
for _ in $(seq 1 60); do
  "$VMPOOL" pools --config "$WORK/vmpool.yaml" --redis-url "$REDIS" --json \
    | python3 -c 'import json,sys; rows=json.load(sys.stdin); sys.exit(0 if all(r["ready"]>=r["size"] for r in rows) else 1)' && break
  sleep 1
done
"$VMPOOL" pools --config "$WORK/vmpool.yaml" --redis-url "$REDIS"
echo

floaty list
floaty get debian=2 centos
HOST=$(cd "$VMFLOATY" && HOME="$WORK/home" ruby -I lib bin/floaty list --active --hostnameonly < /dev/null 2>/dev/null | head -1)
floaty list --active
floaty query "$HOST"
floaty modify "$HOST" --lifetime 12 --tags '{"project":"vmpool"}'
floaty query "$HOST"
floaty modify "$HOST" --lifetime 99
floaty snapshot "$HOST"
sleep 2  # the vm_task job takes the snapshot
SHA=$(cd "$VMFLOATY" && HOME="$WORK/home" ruby -I lib bin/floaty query "$HOST" < /dev/null 2>/dev/null \
  | grep -o '"snapshots"=>\["[a-z0-9]*' | grep -o '[a-z0-9]*$')
floaty revert "$HOST" "$SHA"
floaty modify "$HOST" --disk 10
sleep 2  # the vm_task job adds the disk
floaty query "$HOST"
floaty delete "$HOST"
floaty list --active
floaty status
floaty summary
floaty token status
floaty get centos=3
floaty get debian --ondemand
OD=$("$VMPOOL" vm list --config "$WORK/vmpool.yaml" --redis-url "$REDIS" --json \
  | python3 -c 'import json,sys; print(next((r["name"] for r in json.load(sys.stdin) if r["request_id"]), ""))')
floaty delete "$OD"
"$VMPOOL" audit --config "$WORK/vmpool.yaml" --redis-url "$REDIS"
echo "[audit exit $?]"
