/* The timing loop of OSU's C collective benchmarks, for the overhead comparison:
 * MPI_Wtime around one blocking MPI_Allgather of MPI_CHAR, barrier outside the timed
 * region, per-rank average, then the average across ranks: the reference a ccbench row of
 * the library's allgather is held to (docs/compression.md, "Harness overhead"). Built and
 * run by hand with the MPI in use:
 *   mpicc -O2 -o osu_style_allgather benchmarks/osu_style_allgather.c
 *   mpiexec -bind-to core -n 2 ./osu_style_allgather 1 4096 20000 2000
 * usage: osu_style_allgather MIN MAX ITERATIONS WARMUP */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long lo = atol(argv[1]), hi = atol(argv[2]);
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);
    char *sendbuf = calloc(hi, 1), *recvbuf = calloc(hi * size, 1);
    for (long msg = lo; msg <= hi; msg *= 2) {
        double timer = 0.0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < iters + warmup; i++) {
            double t0 = MPI_Wtime();
            MPI_Allgather(sendbuf, (int)msg, MPI_CHAR, recvbuf, (int)msg, MPI_CHAR,
                          MPI_COMM_WORLD);
            double t1 = MPI_Wtime();
            if (i >= warmup) timer += t1 - t0;
            MPI_Barrier(MPI_COMM_WORLD);
        }
        double mine = timer / iters, sum = 0.0;
        MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.4f\n", msg, 1e6 * sum / size);
    }
    free(sendbuf);
    free(recvbuf);
    MPI_Finalize();
    return 0;
}
