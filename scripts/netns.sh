#!/usr/bin/env bash
# Network namespaces that stand in for nodes: NODES namespaces joined by veth
# pairs on a bridge, node i at 192.0.2.(i+1) (an address block that exists
# only inside these namespaces). Source it, then call netns_up N; netns_down
# runs on exit.
NETNS_TAG=${NETNS_TAG:-sgb$$}
netns_name() { echo "${NETNS_TAG}n$1"; }
netns_addr() { echo "192.0.2.$(($1 + 1))"; }
netns_down() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^${NETNS_TAG}" || true); do ip netns del "$ns"; done
}
netns_up() {
  local n=$1 sw="${NETNS_TAG}sw" i
  trap netns_down EXIT
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    local ns; ns=$(netns_name $i)
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "${NETNS_TAG}a$i" netns "$ns" type veth peer name "${NETNS_TAG}b$i" netns "$sw"
    ip -n "$ns" addr add "$(netns_addr $i)/24" dev "${NETNS_TAG}a$i"
    ip -n "$ns" link set "${NETNS_TAG}a$i" up
    ip -n "$sw" link set "${NETNS_TAG}b$i" master br0 up
  done
}
# netns_run NODES PER_NODE PORT CMD...: one slimerun per node namespace.
netns_run() {
  local nodes=$1 per=$2 port=$3 i; shift 3
  local pids=()
  for ((i = nodes - 1; i >= 1; i--)); do
    ip netns exec "$(netns_name $i)" bin/slimerun -q --nnodes "$nodes" --node-rank $i --master-addr "$(netns_addr 0)" \
      --master-port "$port" --nproc-per-node "$per" "$@" > /dev/null &
    pids+=($!)
  done
  ip netns exec "$(netns_name 0)" bin/slimerun -q --nnodes "$nodes" --node-rank 0 --master-addr "$(netns_addr 0)" \
    --master-port "$port" --nproc-per-node "$per" "$@"
  local rc=$?
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
# netns_shape NODES RATE: every node's link sends at most RATE (tc tbf, e.g.
# 1gbit), so that the wire, not the processors, bounds what crosses it, as
# a NIC does; RATE none takes the limit off.
netns_shape() {
  local nodes=$1 rate=$2 i
  for ((i = 0; i < nodes; i++)); do
    if [ "$rate" = none ]; then
      ip netns exec "$(netns_name $i)" tc qdisc del dev "${NETNS_TAG}a$i" root 2>/dev/null || true
    else
      ip netns exec "$(netns_name $i)" tc qdisc replace dev "${NETNS_TAG}a$i" root tbf rate "$rate" burst 256k latency 20ms
    fi
  done
}
