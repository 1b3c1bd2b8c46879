# slimego: see README.md.
# A recipe's pipeline fails when any of its commands does (a benchmark that
# fails must not leave an empty table behind a sed or a tee).
SHELL       := /bin/bash
.SHELLFLAGS := -o pipefail -c
GO      ?= go
BIN     := bin
OUT     ?= out
P       ?= 2
# OpenMPI on one node as its defaults have it: two ranks bound to two cores,
# more bound to a socket each, oversubscribed ranks (P > cores) unbound and
# yielding. (Across network namespaces each daemon believes it has the
# machine to itself, and its default binding puts both nodes' ranks on core
# 0: scripts/bench-netns.sh runs it unbound.) slimego's ranks are bound
# (slimerun --bind-to core), and from P = 3 on, where mpirun's default
# binding is not slimego's, `make bench` runs OpenMPI bound alike too (see
# bench). MPIBIND=none compares both unbound.
MPIBIND ?=
MPIRUN  ?= mpirun --allow-run-as-root --oversubscribe $(if $(MPIBIND),--bind-to $(MPIBIND)) --mca btl self,vader

# Where libopenblas-dev is installed, the commands' GEMMs use OpenBLAS
# (make bench-gemm measures both); elsewhere gonum's pure Go. OPENBLAS=0
# forces the latter.
OPENBLAS ?= $(shell [ -e /usr/include/x86_64-linux-gnu/cblas.h ] && ldconfig -p 2>/dev/null | grep libopenblas >/dev/null && echo 1)
# go-nvml's header declares deprecated functions that its bindings still wrap.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

ifeq ($(OPENBLAS),1)
GOTAGS := -tags openblas
export CGO_LDFLAGS := -lopenblas
endif

.PHONY: all build demo test test-netns test-short fuzz bench bench-netns bench-gemm clean kernels kernels-emu device-check mutate

all: build

build:
	$(GO) build $(GOTAGS) -o $(BIN)/ ./cmd/... ./examples/...

# The GPU libraries, with nvcc (none of it is needed to build or test the
# Go module: the commands load them at run time). CUDA_ARCH picks the GPU
# (sm_90: Hopper); CUBLAS_LIB and CUDA_INC point at cuBLAS where it is not
# in the compiler's own paths; NVSHMEM_HOME, where NVSHMEM is installed,
# adds libslimenvshmem.so.
# NVCC_CCBIN: the host compiler nvcc uses; g++-11 where installed, since
# CUDA 11.8 (Debian's) refuses gcc 12.
NVCC       ?= nvcc
CUDA_ARCH  ?= sm_90
NVCC_CCBIN ?= $(shell command -v g++-11 2>/dev/null)
NVCCFLAGS  ?= -O3 -std=c++17 -arch=$(CUDA_ARCH) $(if $(NVCC_CCBIN),-ccbin $(NVCC_CCBIN)) -Xcompiler -fPIC,-Wall
CUDA_INC   ?=
CUBLAS_LIB ?=
NVSHMEM_HOME ?=
KLIB := kernels/build
kernels: $(KLIB)/libslimecuda.so $(if $(NVSHMEM_HOME),$(KLIB)/libslimenvshmem.so)

$(KLIB)/libslimecuda.so: kernels/slime.cu kernels/slime.h kernels/protocol.h kernels/status.h
	@mkdir -p $(KLIB)
	$(NVCC) $(NVCCFLAGS) -shared $(CUDA_INC) -o $@ kernels/slime.cu \
	  $(if $(CUBLAS_LIB),-L$(CUBLAS_LIB) -Xlinker -rpath=$(CUBLAS_LIB)) -lcublas

$(KLIB)/libslimenvshmem.so: kernels/nvshmem.cu kernels/slime.h kernels/status.h
	@mkdir -p $(KLIB)
	$(NVCC) $(NVCCFLAGS) -rdc=true -shared $(CUDA_INC) -I$(NVSHMEM_HOME)/include -o $@ kernels/nvshmem.cu \
	  -L$(NVSHMEM_HOME)/lib -Xlinker -rpath=$(NVSHMEM_HOME)/lib -lnvshmem_host -lnvshmem_device

# The emulated libslimecuda (no GPU, no CUDA: the host's g++), which runs
# the same kernel protocol (kernels/protocol.h) on host threads and is
# adversarial about CUDA's ordering rules; the tests load it through
# SLIME_CUDA_LIB. Its GEMM uses OpenBLAS where libopenblas-dev is installed.
CXX ?= g++
kernels-emu: $(KLIB)/libslimecuda-emu.so

$(KLIB)/libslimecuda-emu.so: kernels/emu/slime_emu.cc kernels/slime.h kernels/protocol.h kernels/status.h
	@mkdir -p $(KLIB)
	$(CXX) -O2 -fPIC -pthread -std=c++20 -Wall -shared $(if $(filter 1,$(OPENBLAS)),-DSLIME_EMU_CBLAS) \
	  -o $@ kernels/emu/slime_emu.cc $(if $(filter 1,$(OPENBLAS)),-lopenblas)

# On a machine with a GPU, where nvcc and Python are but Go may not be:
# make device-bins here builds what travels (slimerun, slimebench and the
# test binaries of the CUDA path, stripped, pure-Go GEMM) into bin/device;
# make device-check there builds the kernels with its nvcc, runs the CUDA
# tests and benchmarks, and writes the tables under $(OUT). bin/ is ignored
# by git: bin/device travels only when the device run carries it (the run
# tool's carry ["bin/device"], command make device-check OUT=$OUT).
# SLIME_DEVICE_CHECK_EMU=1 make device-check rehearses every step here, on
# the emulated library.
DBIN := $(BIN)/device
device-bins:
	@mkdir -p $(DBIN)/tests
	$(GO) build -ldflags='-s -w' -o $(DBIN)/ ./cmd/slimerun ./cmd/slimebench
	for p in kernels device cudagraph intra collective overlap p2p; do \
	  $(GO) test -ldflags='-s -w' -c -o $(DBIN)/tests/$$p.test ./$$p || exit 1; done
	@du -sh $(DBIN)

device-check:
	OUT=$(OUT) scripts/device-check.sh

# The main job: a 4-rank AllGather with a check, then a short benchmark.
demo: build
	$(BIN)/slimerun --standalone --nproc-per-node 4 $(BIN)/allgather --mode intra
	$(BIN)/slimerun -q --standalone --nproc-per-node 4 $(BIN)/slimebench allgather -b 8 -e 4M -f 8

# vet, then every package under the race detector; the multi-process tests
# build the commands and launch them through slimerun.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...
	# The allocation counts, which the race detector's own allocations
	# hide (they skip under -race).
	$(GO) test -count=1 -run 'Allocs$$' ./p2p

# Nodes in network namespaces joined by veth pairs (root and iproute2).
test-netns:
	SLIME_NETNS=1 $(GO) test -count=1 -timeout 10m -run Netns -v ./collective/ ./p2p/ ./examples/kvcache/

test-short:
	$(GO) test -count=1 ./...

# Every decoder of bytes from the wire, the store or /proc, 30 s each
# (FUZZTIME).
FUZZTIME ?= 30s
FUZZ := rendezvous:FuzzDecode rendezvous:FuzzServer inter:FuzzDecode inter:FuzzParseAddr inter:FuzzDecodeGone \
  internal/auth:FuzzHandshake internal/shm:FuzzCheckName internal/shm:FuzzParseStartTime \
  intra:FuzzIdentity collective:FuzzParseTasksPerNode collective:FuzzParseWhere collective:FuzzParseKnobs collective:FuzzDecodeCall \
  p2p:FuzzDecodeHeader p2p:FuzzDecodeDescs p2p:FuzzDecodeIPCGrant p2p:FuzzDecodeInfo p2p:FuzzRemoteRegion p2p:FuzzProcAddr \
  launcher:FuzzParsePlacement launcher:FuzzParseNodeInfo launcher:FuzzParseErrorFile \
  internal/machine:FuzzCountCPUList internal/machine:FuzzStatFields internal/machine:FuzzVMARange internal/cpustat:FuzzParse
fuzz:
	@for t in $(FUZZ); do \
	  echo "== $$t"; $(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) ./$${t%%:*} || exit 1; done

# Mutation testing, not in CI (minutes per package): gremlins, installed
# through the Go proxy into $(BIN), over each package of MUTATE against its
# own tests only; one mutant at a time (the tests start processes and
# sockets of their own, and two at once on two cores time out), each test
# run bounded by MUTATE_TIMEOUT times the package's coverage run. Efficacy
# per package in $(OUT)/mutate/<pkg>.txt (and .json); docs/MUTATION.md
# says what survives and why.
GREMLINS       ?= github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0
MUTATE         ?= intra inter rendezvous launcher device
MUTATE_TIMEOUT ?= 4
mutate:
	GOBIN=$(abspath $(BIN)) $(GO) install $(GREMLINS)
	@mkdir -p $(OUT)/mutate
	@for p in $(MUTATE); do echo "== $$p $$(date +%T)"; \
	  GOFLAGS=-count=1 $(BIN)/gremlins unleash --workers 1 --timeout-coefficient $(MUTATE_TIMEOUT) \
	    -o $(OUT)/mutate/$$p.json ./$$p > $(OUT)/mutate/$$p.txt 2>&1 || { tail -20 $(OUT)/mutate/$$p.txt; exit 1; }; \
	  grep -E 'LIVED|TIMED OUT' $(OUT)/mutate/$$p.txt; tail -5 $(OUT)/mutate/$$p.txt; done

# slimego beside OpenMPI (where mpicc is installed), for each P of PS ranks
# on this machine: REPS interleaved runs of each (slimego, slimego on plain
# buffers, OpenMPI, then again), compared by their medians, one table per P
# with a ratio per row (OpenMPI's time over slimego's: above 1, slimego is
# faster). OpenMPI runs as its docs advise on one node, shared memory (vader)
# and --oversubscribe, which makes it yield when idle where ranks outnumber
# the cores. slimego's ranks are bound (slimerun --bind-to core: one per
# CPU, dealt round where they outnumber the CPUs); mpirun binds its ranks
# alike by default only where P is 2 (more to a socket each, and none
# where they outnumber the cores), so from P = 3 OpenMPI runs twice: as
# its default (openmpi) and bound as slimego is (openmpi-bound: --map-by
# core --bind-to core:overload-allowed). MPIBIND=none leaves both unbound.
# Where P is at most the cores, slimego's run has the ceiling column
# (slimebench allgather --ceiling): between its timed calls out of place,
# each rank copies its source into each block of its destination, the
# all-gather's copies alone on its own buffers, timed in the same moments
# (the memory's speed moves while the runs go on); its ratio is the share
# of that bound reached. The two-thread memcpy table at the end
# (slimebench memcpy --threads 2, to 256 MiB) is the machine's copy speed
# at the end of the run: out of place, two ranks copy 4·S bytes between
# them; a row of S is no bound for S, its 2·S bytes of buffers stay in
# the cache where the all-gather's 6·S do not.
# Where P is at most the cores, each table also has the bound column memcpy-gather
# (slimebench memcpy --threads P --gather: P threads doing the all-gather's
# copies alone, block for block), whose ratio is the share of that bound
# slimego's row reaches. P feeds the
# overlap run. BENCH_ARGS narrows the sweep (BENCH_ARGS="-b 8 -e 64K"; both
# programs take -b, -e, -f). Tables and CSV land in $(OUT)/bench.
REPS    ?= 3
PS      ?= 2 4 8
bench: build
	@mkdir -p $(OUT)/bench
	rm -f $(OUT)/bench/*.csv
	@if command -v mpicc >/dev/null; then mpicc -O2 -o $(BIN)/allgather_mpi bench/mpi/allgather_mpi.c -lm; \
	  else echo "mpicc not found: install openmpi-bin libopenmpi-dev to compare with OpenMPI"; fi
	@for p in $(PS); do for i in $$(seq $(REPS)); do \
	  echo "== P=$$p: run $$i of $(REPS)" >&2; \
	  bind=$$([ -z "$(MPIBIND)" ] && echo --bind-to core); \
	  ceil=$$([ $$p -le $$(getconf _NPROCESSORS_ONLN) ] && echo --ceiling); \
	  $(BIN)/slimerun -q --standalone --nproc-per-node $$p $$bind $(BIN)/slimebench allgather --buffers symmetric --csv --quiet $$ceil $(BENCH_ARGS) \
	    | sed 's/^\[0\]: //' > $(OUT)/bench/slimego.P$$p.$$i.csv || exit 1; \
	  $(BIN)/slimerun -q --standalone --nproc-per-node $$p $$bind $(BIN)/slimebench allgather --buffers plain --csv --quiet $(BENCH_ARGS) \
	    | sed 's/^\[0\]: //; s/^slimego/slimego-plain/' > $(OUT)/bench/slimego-plain.P$$p.$$i.csv || exit 1; \
	  if [ -x $(BIN)/allgather_mpi ]; then $(MPIRUN) -np $$p $(BIN)/allgather_mpi $(BENCH_ARGS) 2>/dev/null > $(OUT)/bench/openmpi.P$$p.$$i.csv || exit 1; \
	    if [ -z "$(MPIBIND)" ] && [ $$p -gt 2 ]; then \
	      $(MPIRUN) --map-by core --bind-to core:overload-allowed -np $$p $(BIN)/allgather_mpi $(BENCH_ARGS) 2>/dev/null \
	        | sed 's/^openmpi/openmpi-bound/' > $(OUT)/bench/openmpi-bound.P$$p.$$i.csv || exit 1; fi; fi; \
	done; done
	@t=$$([ $$(getconf _NPROCESSORS_ONLN) -ge 2 ] && echo 2 || echo 1); \
	  $(BIN)/slimebench memcpy --threads $$t --csv $(BENCH_ARGS) > $(OUT)/bench/memcpy.csv && \
	  $(BIN)/slimebench memcpy --threads $$t --csv -b 256M -e 256M | tail -n +2 >> $(OUT)/bench/memcpy.csv
	@for p in $(PS); do [ $$p -le $$(getconf _NPROCESSORS_ONLN) ] || continue; \
	  $(BIN)/slimebench memcpy --threads $$p --gather --csv $(BENCH_ARGS) > $(OUT)/bench/memcpy-gather.P$$p.csv; done
	@for p in $(PS); do \
	  echo; echo "== P=$$p, one node: slimego (symmetric buffers) vs slimego (plain buffers), OpenMPI (vader)$$([ -f $(OUT)/bench/memcpy-gather.P$$p.csv ] && echo ' and the bound (memcpy-gather: the all-gather'"'"'s copies alone; its ratio is the share of the bound slimego reaches)')$$([ $$p -le $$(getconf _NPROCESSORS_ONLN) ] && echo '; ceiling: the all-gather'"'"'s copies alone, each rank copying its source into every block of its destination between slimego'"'"'s timed calls (its ratio is the share of that bound reached)') =="; \
	  $(BIN)/slimebench compare $(OUT)/bench/slimego.P$$p.*.csv $(OUT)/bench/slimego-plain.P$$p.*.csv \
	    $$(ls $(OUT)/bench/openmpi.P$$p.*.csv $(OUT)/bench/openmpi-bound.P$$p.*.csv $(OUT)/bench/memcpy-gather.P$$p.csv 2>/dev/null) \
	    | tee $(OUT)/bench/compare-P$$p.txt; done
	@echo; echo "== two-thread memcpy, the machine's copy speed after the runs (busbw column = GB/s of the pair's copy; out of place, two ranks copy 4*S bytes) =="
	@cat $(OUT)/bench/memcpy.csv
	@echo; echo "== AllGather+GEMM overlap, P=$(P), one node (plot: $(OUT)/bench/overlap.png) =="
	$(BIN)/slimerun -q --standalone --nproc-per-node $(P) $(BIN)/slimebench overlap --m-min 64 --m-max 1024 --nk 256,512 \
	  --iters 5 --quiet --plot $(OUT)/bench/overlap.png | sed 's/^\[0\]: //' | tee $(OUT)/bench/overlap.txt

# Across two network namespaces: raw TCP, slimego beside OpenMPI's TCP
# transport (REPS interleaved runs of each, 2 x 1 and 2 x 2; BENCH_ARGS),
# and the hierarchical schedule against a flat ring (root and iproute2).
bench-netns: build
	@if command -v mpicc >/dev/null; then mpicc -O2 -o $(BIN)/allgather_mpi bench/mpi/allgather_mpi.c -lm; fi
	OUT=$(OUT) REPS=$(REPS) BENCH_ARGS="$(BENCH_ARGS)" scripts/bench-netns.sh

# GEMM GFLOP/s of gonum's pure Go and, where libopenblas-dev is installed,
# of OpenBLAS through gonum's netlib binding (build tag openblas).
bench-gemm:
	$(GO) build -o $(BIN)/slimebench-gonum ./cmd/slimebench
	$(BIN)/slimebench-gonum gemm
	@if [ "$(OPENBLAS)" = 1 ]; then \
	  $(GO) build -tags openblas -o $(BIN)/slimebench-openblas ./cmd/slimebench && $(BIN)/slimebench-openblas gemm; \
	else echo "libopenblas-dev not installed: gonum only"; fi

clean:
	rm -rf $(BIN) $(OUT) $(KLIB)
