#!/usr/bin/env bash
# make device-check: the CUDA backend on a machine with a GPU, in one go.
#
# Needs nvcc, and the Go binaries built beforehand where Go is (make
# device-bins): bin/device/slimerun, bin/device/slimebench and the test
# binaries under bin/device/tests. Builds the kernels with the nvcc there (cuBLAS and NVSHMEM
# found in the CUDA toolkit or in Python's nvidia-* packages), prints the
# topology, runs the CUDA tests, then the benchmarks with 2, 4 and 8 ranks
# on the one GPU, as goroutines of one process (one CUDA context) and as
# processes through CUDA IPC, in graph and eager mode, beside a
# device-to-device copy. Everything lands in $OUT (at most 8 files):
#   summary.txt  tables, in order (topology, tests, d2d, all-gather, overlap)
#   tests.log    the tests' output
#   bench.csv    every benchmark row
#   build.log    the kernels' build
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/device}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
SUM=$OUT/summary.txt
: >"$SUM"
say() { echo "$@" | tee -a "$SUM"; }
deadline() { timeout --signal=KILL "$@"; }   # every step bounded

say "== device-check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUM"
for b in bin/device/slimerun bin/device/slimebench bin/device/tests/collective.test; do
  [ -x "$b" ] || { say "missing $b: run make device-bins where Go is, before this"; exit 2; }
done

# cuBLAS, CUDA headers and NVSHMEM: the toolkit's, else the Python wheels'.
py=$(command -v python3 || true)
site=""
[ -n "$py" ] && site=$($py -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
find_one() { # pattern, roots... (link stubs are no use at run time)
  local pat=$1; shift
  find "$@" -name "$pat" -not -path '*/stubs/*' 2>/dev/null | head -1
}
roots="/usr/local/cuda $(dirname "$(dirname "$(command -v nvcc)")") $site"
cublas=$(find_one 'libcublas.so*' $roots)
cublas_dir=$(dirname "${cublas:-/nonexistent/x}")
mkdir -p kernels/build/lib
if [ -n "$cublas" ] && [ ! -e "$cublas_dir/libcublas.so" ]; then
  # wheels carry only the versioned names: give the linker the plain one
  ln -sf "$cublas" kernels/build/lib/libcublas.so
  lt=$(find_one 'libcublasLt.so*' "$cublas_dir")
  [ -n "$lt" ] && ln -sf "$lt" kernels/build/lib/libcublasLt.so
fi
inc=""
h=$(find_one cublas_v2.h $roots); [ -n "$h" ] && inc="-I$(dirname "$h")"
say "nvcc: $(nvcc --version | tail -1); cuBLAS: ${cublas:-not found}"
nvshmem_home=""
nh=$(find_one nvshmem.h $site /usr/local /opt 2>/dev/null)
if [ -n "$nh" ]; then
  nvshmem_home=$(dirname "$(dirname "$nh")")
  if [ ! -d "$nvshmem_home/lib" ]; then
    nvshmem_home=""
  elif [ ! -e "$nvshmem_home/lib/libnvshmem_host.so" ]; then
    # wheels carry versioned names only: a shadow tree with the plain ones
    shadow=$PWD/kernels/build/nvshmem
    mkdir -p "$shadow/lib"
    ln -sfn "$nvshmem_home/include" "$shadow/include"
    for f in "$nvshmem_home"/lib/*; do
      ln -sf "$f" "$shadow/lib/"
      base=$(basename "$f"); plain=${base%%.so.*}
      [ "$plain" != "$base" ] && ln -sf "$f" "$shadow/lib/$plain.so"
    done
    nvshmem_home=$shadow
  fi
fi
say "NVSHMEM: ${nvshmem_home:-not found}"
MAKEVARS=(CUDA_INC="$inc" CUBLAS_LIB="$cublas_dir")
[ -e kernels/build/lib/libcublas.so ] && MAKEVARS=(CUDA_INC="$inc" CUBLAS_LIB="$PWD/kernels/build/lib")
rm -f kernels/build/libslime*.so
if ! command -v make >/dev/null; then
  # no make there: the same commands as the Makefile's kernels target
  make() {
    shift # "kernels"
    local v CUDA_INC="" CUBLAS_LIB="" NVSHMEM_HOME=""
    for v in "$@"; do local "$v"; done
    mkdir -p kernels/build
    nvcc -O3 -std=c++17 -arch=sm_90 -Xcompiler -fPIC,-Wall -shared $CUDA_INC -o kernels/build/libslimecuda.so \
      kernels/slime.cu -L"$CUBLAS_LIB" -Xlinker -rpath="$CUBLAS_LIB" -lcublas || return 1
    [ -z "$NVSHMEM_HOME" ] && return 0
    nvcc -O3 -std=c++17 -arch=sm_90 -Xcompiler -fPIC,-Wall -rdc=true -shared $CUDA_INC -I"$NVSHMEM_HOME/include" \
      -o kernels/build/libslimenvshmem.so kernels/nvshmem.cu -L"$NVSHMEM_HOME/lib" -Xlinker -rpath="$NVSHMEM_HOME/lib" \
      -lnvshmem_host -lnvshmem_device
  }
fi
if ! deadline 180 make kernels "${MAKEVARS[@]}" >"$OUT/build.log" 2>&1; then
  say "make kernels failed:"; tail -20 "$OUT/build.log" | tee -a "$SUM"; exit 1
fi
if [ -n "$nvshmem_home" ]; then
  if deadline 180 make kernels "${MAKEVARS[@]}" NVSHMEM_HOME="$nvshmem_home" >>"$OUT/build.log" 2>&1; then
    say "libslimenvshmem.so built"
  else
    say "libslimenvshmem.so did not build (see build.log); GPU data across nodes stays host-staged"
    tail -8 "$OUT/build.log" | tee -a "$SUM"
  fi
fi
export LD_LIBRARY_PATH="$cublas_dir:$PWD/kernels/build/lib:${LD_LIBRARY_PATH:-}"
export SLIME_CUDA_LIB=$PWD/kernels/build/libslimecuda.so
[ -e kernels/build/libslimenvshmem.so ] && export SLIME_NVSHMEM_LIB=$PWD/kernels/build/libslimenvshmem.so

say; say "== topology"
deadline 30 bin/device/slimerun --print-topology 2>&1 | tee -a "$SUM"

say; say "== tests (-v output in tests.log)"
: >"$OUT/tests.log"
for t in kernels device cudagraph collective overlap; do
  run="."
  case $t in collective|overlap) run=GPU ;; esac
  (cd $t && deadline 150 ../bin/device/tests/$t.test -test.v -test.count=1 -test.run "$run" >"$OUT/test-$t.tmp" 2>&1)
  rc=$?
  say "$t: $( [ $rc = 0 ] && echo PASS || echo "FAIL (exit $rc)")"
  grep -E -- '^(--- (FAIL|SKIP)|panic)' "$OUT/test-$t.tmp" | tail -8 | tee -a "$SUM"
  cat "$OUT/test-$t.tmp" >>"$OUT/tests.log" && rm -f "$OUT/test-$t.tmp"
done

say; say "== device-to-device copy (the ceiling)"
deadline 60 bin/device/slimebench d2d -b 8 -e 64M -f 8 2>&1 | tee -a "$SUM"
deadline 60 bin/device/slimebench d2d -b 8 -e 64M -f 8 --csv >"$OUT/bench.csv" 2>/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sweep=(-b 8 -e 64M -f 8 --quiet --csv)
for P in 2 4 8; do
  for launch in graph eager; do
    flag=(); [ $launch = eager ] && flag=(--eager-mode)
    deadline 100 bin/device/slimebench allgather --backend cuda --in-process $P "${flag[@]}" "${sweep[@]}" 2>>"$OUT/tests.log" \
      | sed "s/^slimego/slimego-$launch/" >"$tmp/inproc-$P-$launch.csv" \
      || say "in-process P=$P $launch: failed (see tests.log)"
    grep -v '^impl' "$tmp/inproc-$P-$launch.csv" >>"$OUT/bench.csv"
  done
  say; say "== $P ranks in one process (one CUDA context): graph vs eager (ratio = eager / graph time)"
  bin/device/slimebench compare "$tmp/inproc-$P-graph.csv" "$tmp/inproc-$P-eager.csv" 2>&1 | tee -a "$SUM"
done
for P in 2 4 8; do
  for launch in graph eager; do
    flag=(); [ $launch = eager ] && flag=(--eager-mode)
    deadline 100 bin/device/slimerun -q --standalone --nproc-per-node $P bin/device/slimebench allgather --backend cuda \
      "${flag[@]}" -b 8 -e 4M -f 8 --quiet --csv 2>>"$OUT/tests.log" | sed "s/^\[0\]: //; s/^slimego/slimego-proc-$launch/" \
      >"$tmp/proc-$P-$launch.csv" || say "processes P=$P $launch: failed (see tests.log)"
    grep -v '^impl' "$tmp/proc-$P-$launch.csv" >>"$OUT/bench.csv"
  done
  say; say "== $P processes (CUDA IPC; time-sliced without MPS): graph vs eager"
  bin/device/slimebench compare "$tmp/proc-$P-graph.csv" "$tmp/proc-$P-eager.csv" 2>&1 | tee -a "$SUM"
done
say; say "== AllGather+GEMM overlap, 4 ranks in one process, cuBLAS (graph, then eager)"
for launch in graph eager; do
  flag=(); [ $launch = eager ] && flag=(--eager-mode)
  deadline 100 bin/device/slimebench overlap --backend cuda --in-process 4 "${flag[@]}" --m-min 256 --m-max 4096 \
    --nk 4096 --pieces 4 --iters 5 --quiet 2>&1 | tee -a "$SUM"
done
say; say "== done $(date -u +%FT%TZ)"
