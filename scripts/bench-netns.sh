#!/usr/bin/env bash
# make bench-netns: AllGather across two network namespaces (veth), beside
# raw TCP and OpenMPI's TCP transport over the same link, and AllGather+GEMM
# overlap on the link as it is and limited to a few rates. Needs root,
# iproute2 (ip, tc); OpenMPI where installed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}/bench-netns
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # absolute: mpirun's launch agent and the plots are named from other directories
. scripts/netns.sh
netns_up 2
strip() { sed 's/^\[0\]: //'; }

echo "== raw TCP across the veth link (slimebench tcp)"
netns_run 2 1 29500 bin/slimebench tcp | strip | tee "$OUT/tcp.txt"

# The target's comparison: the all-gather and a duplex transfer of the same
# size on plain sockets, alternating within every iteration (on a shared
# machine the link itself moves by tens of percent between runs).
echo "== slimego AllGather beside the link, 2 nodes x 1 rank, interleaved (slimebench link)"
netns_run 2 1 29510 bin/slimebench link -b 1M -e 64M -f 4 --min-time 2s --quiet | strip | tee "$OUT/link.txt"

# slimego and OpenMPI alternate, REPS runs of each (default 3), 2 x 1 then
# 2 x 2, and each table is the median of its runs (slimebench compare).
# BENCH_ARGS narrows the sweep (both programs take -b, -e, -f).
REPS=${REPS:-3}
BENCH_ARGS=${BENCH_ARGS:-}
rm -f "$OUT"/slimego-2x*.csv "$OUT"/openmpi-2x*.csv "$OUT"/openmpi-bound-2x*.csv
have_mpi=0
if command -v mpirun >/dev/null && [ -x bin/allgather_mpi ]; then
  have_mpi=1
  # mpirun runs in node 0's namespace; its launch agent starts the remote
  # daemon in node 1's. The namespaces share the host name and /dev/shm,
  # so each node's shared-memory transport (vader) would name its segments
  # as the other's does (host name, job, local rank), and 2 x 2 crashed in
  # vader: node 1's daemon, and so its ranks, keep theirs in a directory of
  # their own.
  shm1=/dev/shm/$(netns_name 1)-vader
  mkdir -p "$shm1"
  trap 'rm -rf "$shm1"; netns_down' EXIT
  cat > "$OUT/rsh-agent" <<AGENT
#!/bin/sh
host=\$1; shift
while [ "\${host#-}" != "\$host" ]; do host=\$1; shift; done
exec ip netns exec $(netns_name 1) env OMPI_MCA_btl_vader_backing_directory=$shm1 sh -c "\$*"
AGENT
  chmod +x "$OUT/rsh-agent"
fi
# Each node's daemon sees the whole machine as its own: left to bind ranks
# to cores, both daemons put their rank on core 0, and the two ranks
# time-slice one core. --bind-to none lets the scheduler place them (the
# openmpi column); pml ob1 keeps the TCP BTL that btl names (no UCX).
# slimego's ranks are bound (slimerun --bind-to core, whose nodes on one
# machine deal its CPUs between them: node 0's local rank i on CPU i, node
# 1's after them, round the CPUs), so OpenMPI also runs bound alike, with
# a rankfile (the openmpi-bound column).
# Nor does either daemon know that the two nodes share the machine's cores:
# where the job's ranks outnumber them, OpenMPI's own advice for
# oversubscription applies (mpi_yield_when_idle 1), which mpirun would have
# set itself had it seen the oversubscription (without it, spinning ranks
# hold the cores for whole scheduler slices: milliseconds per call).
mpi_netns() { # ranks-per-node csv-name [bound]
  local yield=0 place=(--bind-to none) name=openmpi r
  [ $((2 * $1)) -gt "$(getconf _NPROCESSORS_ONLN)" ] && yield=1
  if [ "${3:-}" = bound ]; then
    name=openmpi-bound
    : > "$OUT/rankfile"
    for ((r = 0; r < 2 * $1; r++)); do
      echo "rank $r=$(netns_addr $((r / $1))) slot=$((r % $(getconf _NPROCESSORS_ONLN)))" >> "$OUT/rankfile"
    done
    place=(--rankfile "$OUT/rankfile")
  fi
  # A failed run is reported and dropped; the script goes on (with
  # pipefail, the if sees mpirun's status, and errexit does not apply).
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
  if ! ip netns exec "$(netns_name 0)" mpirun --allow-run-as-root -np $((2 * $1)) \
    --host "$(netns_addr 0):$1,$(netns_addr 1):$1" "${place[@]}" --mca mpi_yield_when_idle $yield \
    --mca plm_rsh_agent "$OUT/rsh-agent" --mca pml ob1 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include 192.0.2.0/24 --mca oob_tcp_if_include 192.0.2.0/24 \
    bin/allgather_mpi -m inter $BENCH_ARGS 2>"$OUT/$name-$2.err" | sed "s/^openmpi/$name/" > "$OUT/$name-$2.csv"; then
    echo "OpenMPI across namespaces ($2, $name) failed (see $OUT/$name-$2.err)"
    rm -f "$OUT/$name-$2.csv"
  fi
}
for i in $(seq "$REPS"); do
  echo "== run $i of $REPS: slimego and OpenMPI (TCP; unbound, then bound) alternating, 2 nodes x 1 rank, then 2 x 2 (hierarchical, ring)"
  # shellcheck disable=SC2086
  netns_run 2 1 $((29520 + i)) --bind-to core bin/slimebench allgather --mode inter --quiet --csv $BENCH_ARGS | strip > "$OUT/slimego-2x1.$i.csv"
  [ $have_mpi = 1 ] && mpi_netns 1 "2x1.$i" && mpi_netns 1 "2x1.$i" bound
  # shellcheck disable=SC2086
  netns_run 2 2 $((29540 + i)) --bind-to core bin/slimebench allgather --mode inter --quiet --csv $BENCH_ARGS | strip > "$OUT/slimego-2x2-hier.$i.csv"
  # shellcheck disable=SC2086
  SLIME_ALGO=ring netns_run 2 2 $((29560 + i)) --bind-to core bin/slimebench allgather --mode inter --quiet --csv $BENCH_ARGS | strip \
    | sed 's/^slimego/slimego-ring/' > "$OUT/slimego-2x2-ring.$i.csv"
  [ $have_mpi = 1 ] && mpi_netns 2 "2x2.$i" && mpi_netns 2 "2x2.$i" bound
done

# Side by side, a ratio per row (each other's time over slimego's: above 1,
# slimego is faster). Without OpenMPI, 2 x 1 is slimego's runs alone.
echo; echo "== 2 x 1: slimego vs OpenMPI (TCP, unbound and bound), medians of $REPS interleaved runs"
if ls "$OUT"/openmpi-2x1.*.csv >/dev/null 2>&1; then
  # shellcheck disable=SC2046
  bin/slimebench compare "$OUT"/slimego-2x1.*.csv "$OUT"/openmpi-2x1.*.csv $(ls "$OUT"/openmpi-bound-2x1.*.csv 2>/dev/null) \
    | tee "$OUT/compare-2x1.txt"
else
  cat "$OUT"/slimego-2x1.*.csv | tee "$OUT/compare-2x1.txt"
fi
echo; echo "== 2 x 2: slimego (hierarchical) vs ring and OpenMPI (TCP, unbound and bound), medians of $REPS interleaved runs"
# shellcheck disable=SC2046
bin/slimebench compare "$OUT"/slimego-2x2-hier.*.csv "$OUT"/slimego-2x2-ring.*.csv \
  $(ls "$OUT"/openmpi-2x2.*.csv "$OUT"/openmpi-bound-2x2.*.csv 2>/dev/null) | tee "$OUT/compare-2x2.txt"

echo; echo "== AllGather+GEMM overlap across the namespaces, 2 nodes x 1 rank (plot: $OUT/overlap.png)"
# n small against k makes t_comm and t_gemm comparable on these machines.
netns_run 2 1 29505 bin/slimebench overlap --quiet --m-min 256 --m-max 2048 --nk 1024 --n 32 --iters 5 \
  --plot "$OUT/overlap.png" | strip | tee "$OUT/overlap.txt"

# Unlimited, the veth link is as fast as the kernel copies, so the gather
# keeps the processors as busy as the GEMMs do. Slowed with tc, the wire
# bounds it, as a NIC's does, and leaves them to the GEMMs. At each rate n
# is picked so that t_gemm is 1.1-2.0x t_comm in our runs (the ratio goes with n,
# the link and the GEMM's speed); pieces may be as small as 256 KiB, since
# a message of one connection moves at the wire's speed.
for spec in "1gbit 1024 896 512 2048" "500mbit 1024 2048 512 2048" "250mbit 4096 4096 128 512"; do
  read -r rate k n mlo mhi <<<"$spec"
  echo; echo "== AllGather+GEMM overlap, 2 nodes x 1 rank, links limited to $rate (tc tbf)"
  netns_shape 2 "$rate"
  netns_run 2 1 29506 bin/slimebench overlap --quiet --m-min "$mlo" --m-max "$mhi" --nk "$k" --n "$n" --iters 15 \
    --min-piece 256K --plot "$OUT/overlap-$rate.png" | strip | tee "$OUT/overlap-$rate.txt"
  netns_shape 2 none
done
