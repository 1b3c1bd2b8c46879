package main

import (
	"encoding/csv"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// mpiStub is an MPI of one rank, enough to build bench/mpi's program
// with a plain C compiler where no MPI is installed.
const mpiStub = `#include <string.h>
#include <time.h>
typedef int MPI_Comm, MPI_Datatype, MPI_Op;
#define MPI_COMM_WORLD 0
#define MPI_BYTE 1
#define MPI_LONG_LONG 8
#define MPI_DOUBLE 8
#define MPI_SUM 0
#define MPI_MAX 1
#define MPI_MAX_PROCESSOR_NAME 256
#define MPI_IN_PLACE ((void *)1)
static int MPI_Init(int *c, char ***v) { (void)c; (void)v; return 0; }
static int MPI_Finalize(void) { return 0; }
static int MPI_Comm_size(MPI_Comm c, int *n) { (void)c; *n = 1; return 0; }
static int MPI_Comm_rank(MPI_Comm c, int *r) { (void)c; *r = 0; return 0; }
static int MPI_Get_processor_name(char *s, int *n) { s[0] = 0; *n = 0; return 0; }
static int MPI_Barrier(MPI_Comm c) { (void)c; return 0; }
static double MPI_Wtime(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c) {
    (void)sn; (void)st; (void)rt; (void)c; if (s != MPI_IN_PLACE) memcpy(r, s, rn); return 0; }
static int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype d, MPI_Op o, MPI_Comm c) {
    (void)o; (void)c; memcpy(r, s, (size_t)n * d); return 0; }
static int MPI_Reduce(const void *s, void *r, int n, MPI_Datatype d, MPI_Op o, int root, MPI_Comm c) {
    (void)o; (void)root; (void)c; memcpy(r, s, (size_t)n * d); return 0; }
`

// TestMPISweepMatches: bench/mpi's OpenMPI program sweeps the sizes that
// slimebench allgather sweeps for the same -b, -e and -f (make bench
// passes BENCH_ARGS to both, and compare matches rows by size): bounds
// alone are BENCHMARKS.md's sizes between them and the bounds themselves, a
// step factor nccl-tests' grid. Built against a one-rank MPI stub.
func TestMPISweepMatches(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mpi.h"), []byte(mpiStub), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "allgather_mpi")
	if out, err := exec.Command(cc, "-O1", "-I", dir, "-o", bin, filepath.Join("..", "..", "bench", "mpi", "allgather_mpi.c"), "-lm").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	for _, args := range [][]string{
		{"-b", "8", "-e", "64K"},
		{"-b", "1K", "-e", "1M"},
		{"-e", "4K"},
		{"-b", "100", "-e", "1000", "-f", "3"},
		{"-b", "8", "-e", "12", "-f", "1.05"},
	} {
		fs := pflag.NewFlagSet("slimebench allgather", pflag.ContinueOnError)
		sw := sweepFlags(fs, defaultSizes)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		want, err := sw.sizes()
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, append(args, "-n", "1", "-w", "1")...).Output()
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var got []int64
		for _, r := range rows[1:] {
			if !strings.HasSuffix(r[0], "/in-place") {
				s, _ := strconv.ParseInt(r[5], 10, 64)
				got = append(got, s)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%v: allgather_mpi sweeps %v, slimebench allgather %v", args, got, want)
		}
	}
}
