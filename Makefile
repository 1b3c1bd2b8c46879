# slimego: see README.md.
GO      ?= go
BIN     := bin
OUT     ?= out
P       ?= 2
MPIRUN  ?= mpirun --allow-run-as-root --oversubscribe --mca btl self,vader

.PHONY: all build demo test test-short fuzz bench bench-mpi clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/... ./examples/...

# The main job: a 4-rank AllGather with a check, then a short benchmark.
demo: build
	$(BIN)/slimerun --standalone --nproc-per-node 4 $(BIN)/allgather --mode intra
	$(BIN)/slimerun -q --standalone --nproc-per-node 4 $(BIN)/slimebench allgather -b 8 -e 4M -f 8

# vet, then every package under the race detector; the multi-process tests
# build the commands and launch them through slimerun.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...

test-short:
	$(GO) test -count=1 ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 30s ./rendezvous

# slimego beside OpenMPI (where mpicc is installed) and single-core memcpy,
# P ranks on this machine, one run. Tables and CSV land in $(OUT)/bench.
bench: build
	@mkdir -p $(OUT)/bench
	rm -f $(OUT)/bench/openmpi.csv
	$(BIN)/slimebench memcpy --csv > $(OUT)/bench/memcpy.csv
	$(BIN)/slimerun -q --standalone --nproc-per-node $(P) $(BIN)/slimebench allgather --buffers symmetric --csv > $(OUT)/bench/slimego.raw
	sed 's/^\[0\]: //' $(OUT)/bench/slimego.raw > $(OUT)/bench/slimego.csv
	$(BIN)/slimerun -q --standalone --nproc-per-node $(P) $(BIN)/slimebench allgather --buffers plain --csv > $(OUT)/bench/slimego-plain.raw
	sed 's/^\[0\]: //; s/^slimego/slimego-plain/' $(OUT)/bench/slimego-plain.raw > $(OUT)/bench/slimego-plain.csv
	@if command -v mpicc >/dev/null; then $(MAKE) --no-print-directory bench-mpi; \
	  else echo "mpicc not found: install openmpi-bin libopenmpi-dev to compare with OpenMPI"; fi
	@echo; echo "== slimego (symmetric buffers) vs slimego (plain buffers), OpenMPI and memcpy, P=$(P) =="
	$(BIN)/slimebench compare $(OUT)/bench/slimego.csv $(OUT)/bench/slimego-plain.csv \
	  $$(test -f $(OUT)/bench/openmpi.csv && echo $(OUT)/bench/openmpi.csv) | tee $(OUT)/bench/compare.txt
	@echo; echo "== single-core memcpy (the ceiling) =="; cat $(OUT)/bench/memcpy.csv

bench-mpi:
	@mkdir -p $(OUT)/bench
	mpicc -O2 -o $(BIN)/allgather_mpi bench/mpi/allgather_mpi.c -lm
	$(MPIRUN) -np $(P) $(BIN)/allgather_mpi > $(OUT)/bench/openmpi.csv

clean:
	rm -rf $(BIN) $(OUT)
