/*
 * allgather_mpi: MPI_Allgather measured with slimego's benchmark protocol
 * (../../shared/BENCH.md): the same sizes, warm-up (at least 5 calls and
 * 0.1 s), at least 5 iterations and
 * 0.2 s per size, the median over iterations of the slowest rank's time,
 * algbw and busbw, a byte-for-byte check, and the same CSV columns.
 *
 *   mpicc -O2 -o allgather_mpi allgather_mpi.c
 *   mpirun -np 2 --mca btl self,vader ./allgather_mpi [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-i IMPL]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static uint64_t seed_of(int rank, int iter, uint64_t salt) {
    uint64_t z = (uint64_t)rank * 0x9e3779b97f4a7c15ULL ^ (uint64_t)iter * 0xbf58476d1ce4e5b9ULL ^ salt;
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The stream of internal/pattern.Fill. */
static void fill(unsigned char *b, size_t n, uint64_t s) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s += 0x9e3779b97f4a7c15ULL;
        uint64_t z = (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        memcpy(b + i, &z, 8);
    }
    if (i < n) {
        s += 0x9e3779b97f4a7c15ULL;
        uint64_t z = (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        memcpy(b + i, &z, n - i);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long long parse_size(const char *s) {
    char *end;
    long long n = strtoll(s, &end, 10);
    switch (*end) {
    case 'K': case 'k': n <<= 10; break;
    case 'M': case 'm': n <<= 20; break;
    case 'G': case 'g': n <<= 30; break;
    }
    return n;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int P, me;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    enum { MAX_SIZES = 1000 }; /* bench.MaxSizes */
    long long sizes[MAX_SIZES];
    int nsizes = 0;
    long long lo = -1, hi = -1;
    double factor = 0;
    int fixed_iters = 0, warmup = 5, fixed_warmup = 0;
    const char *impl = "openmpi", *mode = "intra";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b")) lo = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-e")) hi = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-f")) factor = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) fixed_iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]), fixed_warmup = 1;
        else if (!strcmp(argv[i], "-i")) impl = argv[i + 1];
        else if (!strcmp(argv[i], "-m")) mode = argv[i + 1];
    }
    /* The sizes of slimebench allgather for the same flags (make bench
       passes BENCH_ARGS to both, and compare matches rows by size): none
       given, BENCH.md's sweep; bounds alone, BENCH.md's sizes between
       them and the bounds themselves; a step factor, lo, lo*f, ... up to
       hi, each at least a byte larger than the one before. */
    long long def[] = {8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
    int ndef = sizeof def / sizeof def[0];
    if (lo < 0 && hi < 0 && factor == 0) {
        nsizes = ndef;
        memcpy(sizes, def, sizeof def);
    } else {
        if (lo < 0) lo = 8;
        if (hi < 0) hi = 64 << 20;
        if (lo > hi || (factor != 0 && factor <= 1 && lo != hi)) {
            if (me == 0) fprintf(stderr, "allgather_mpi: bad sweep %lld..%lld by x%g\n", lo, hi, factor);
            MPI_Finalize();
            return 2;
        }
        if (factor == 0) {
            sizes[nsizes++] = lo;
            for (int i = 0; i < ndef; i++)
                if (def[i] > lo && def[i] < hi) sizes[nsizes++] = def[i];
            if (hi > lo) sizes[nsizes++] = hi;
        } else {
            for (long long n = lo; n <= hi;) {
                if (nsizes == MAX_SIZES) {
                    if (me == 0) fprintf(stderr, "allgather_mpi: the sweep %lld..%lld by x%g has more than %d sizes\n", lo, hi, factor, MAX_SIZES);
                    MPI_Finalize();
                    return 2;
                }
                sizes[nsizes++] = n;
                if (n * factor >= 9.2e18) break; /* the next overflows */
                long long next = llround(n * factor);
                n = next > n ? next : n + 1;
            }
        }
    }
    char hostname[MPI_MAX_PROCESSOR_NAME];
    int hl;
    MPI_Get_processor_name(hostname, &hl);
    int nodes = 1; /* reported by the caller through -m; one node unless told */
    if (!strcmp(mode, "inter")) nodes = 2;
    if (me == 0) printf("impl,backend,mode,P,nodes,S,median_us,algbw_GBps,busbw_GBps,wrong\n");
    for (int si = 0; si < nsizes; si++) {
        size_t n = (size_t)sizes[si];
        unsigned char *dst = malloc(n * P + 1), *src = malloc(n + 1);
        for (int inplace = 0; inplace < 2; inplace++) {
            /* correctness */
            fill(dst, n * P, 0xdead);
            unsigned char *mine = inplace ? dst + (size_t)me * n : src;
            fill(mine, n, seed_of(me, 1, n));
            if (inplace) MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, dst, (int)n, MPI_BYTE, MPI_COMM_WORLD);
            else MPI_Allgather(src, (int)n, MPI_BYTE, dst, (int)n, MPI_BYTE, MPI_COMM_WORLD);
            long long wrong = 0;
            unsigned char *want = malloc(n + 1);
            for (int r = 0; r < P; r++) {
                fill(want, n, seed_of(r, 1, n));
                for (size_t j = 0; j < n; j++) wrong += dst[(size_t)r * n + j] != want[j];
            }
            free(want);
            long long wrong_all;
            MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            /* warm-up and iteration count, as slimebench's: the first calls,
               then, unless -w fixed the count, rounds until the calls have
               taken 0.1 s (TCP's windows adapt to a new size over many
               calls), each round's count from the pace of the one before;
               the pace is the median call, the largest over ranks */
            double pace[2], pace_all[2], spent = 0;
            long count = warmup;
            for (int round = 0; round < 5; round++) {
                if (count < 1) count = 1;
                double *wt = malloc(sizeof(double) * count), sum = 0;
                for (long i = 0; i < count; i++) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    double t0 = MPI_Wtime();
                    if (inplace) MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, dst, (int)n, MPI_BYTE, MPI_COMM_WORLD);
                    else MPI_Allgather(src, (int)n, MPI_BYTE, dst, (int)n, MPI_BYTE, MPI_COMM_WORLD);
                    wt[i] = MPI_Wtime() - t0;
                    sum += wt[i];
                }
                qsort(wt, count, sizeof(double), cmp);
                pace[0] = count % 2 ? wt[count / 2] : (wt[count / 2 - 1] + wt[count / 2]) / 2;
                pace[1] = sum;
                free(wt);
                MPI_Allreduce(pace, pace_all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                spent += pace_all[1];
                if (fixed_warmup || spent >= 0.1) break;
                count = (long)ceil((0.1 - spent) / (pace_all[0] + 2e-6));
                if (count > 100000) count = 100000;
            }
            double est_all = pace_all[0];
            int iters = fixed_iters;
            if (iters <= 0) {
                iters = (int)ceil(0.2 / (est_all + 2e-6));
                if (iters < 5) iters = 5;
                if (iters > 200000) iters = 200000;
            }
            double *times = malloc(sizeof(double) * iters), *tmax = malloc(sizeof(double) * iters);
            for (int i = 0; i < iters; i++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (inplace) MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, dst, (int)n, MPI_BYTE, MPI_COMM_WORLD);
                else MPI_Allgather(src, (int)n, MPI_BYTE, dst, (int)n, MPI_BYTE, MPI_COMM_WORLD);
                times[i] = (MPI_Wtime() - t0) * 1e6;
            }
            MPI_Reduce(times, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (me == 0) {
                qsort(tmax, iters, sizeof(double), cmp);
                double med = iters % 2 ? tmax[iters / 2] : (tmax[iters / 2 - 1] + tmax[iters / 2]) / 2;
                double algbw = (double)P * n / (med * 1e-6) / 1e9;
                double busbw = algbw * (P - 1) / P;
                printf("%s%s,cpu,%s,%d,%d,%zu,%.3f,%.4f,%.4f,%lld\n", impl, inplace ? "/in-place" : "", mode, P, nodes, n, med, algbw, busbw, wrong_all);
                fflush(stdout);
                fprintf(stderr, "allgather_mpi: %zu bytes per rank%s: %.2f us\n", n, inplace ? " in place" : "", med);
            }
            free(times);
            free(tmax);
        }
        free(dst);
        free(src);
    }
    MPI_Finalize();
    return 0;
}
