/* OSU's timing loop for the MPI library's collectives, called by ccbench's harness through
 * ctypes (benchmarks/timing_c.py builds it with the mpicc of the MPI mpi4py uses).
 *
 * Handles arrive as pointers to the caller's MPI_Comm / MPI_Datatype / MPI_Op (mpi4py's
 * MPI._addressof), so the same source is right for MPICH (int handles) and Open MPI
 * (pointer handles). The loops are the harness's Python loops, line for line:
 *   warm-up:  WARMUP calls, a barrier after each (per-call) or none (batch), then a barrier;
 *   per-call: Wtime around each call, the barrier outside the timed region;
 *   batch:    the calls cut into min(10, N) blocks (numpy.array_split's sizes), Wtime around
 *             each block, a barrier after it; one time per block, per call.
 * The barrier between timed calls is MPI_Barrier, or, where ranks outnumber a host's cores
 * (`yielding`), MPI_Ibarrier tested with the core given away between tests: a rank done
 * with its call would otherwise spin in MPI_Barrier on the core of a rank still in it.
 * The collectives it calls are not listed here: benchmarks/timing_c.py writes one case of
 * `call` per collective of collectives/spec.py into the line marked CALLS before it
 * compiles this file (the case's number is the collective's place in that table). */
#include <mpi.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#define BATCH_BLOCKS 10

int ccbench_handle_size(void) { return (int)sizeof(MPI_Comm); }

int ccbench_library_version(char *out, int len) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(text, &n);
    if (len <= 0) return n;
    strncpy(out, text, (size_t)len - 1);
    out[len - 1] = '\0';
    return n;
}

/* The harness's yielding barrier (benchmarks/timing.py): sched_yield between tests for
 * its first spin_s seconds, then a sleep of poll_s between them. */
typedef struct {
    int yielding;
    double spin_s, poll_s;
} barrier_t;

static int barrier(MPI_Comm comm, const barrier_t *how) {
    if (!how->yielding) return MPI_Barrier(comm);
    MPI_Request request;
    int done = 0, err = MPI_Ibarrier(comm, &request);
    if (err != MPI_SUCCESS) return err;
    double since = MPI_Wtime();
    struct timespec poll = {0, (long)(how->poll_s * 1e9)};
    for (;;) {
        err = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS || done) return err;
        if (MPI_Wtime() - since > how->spin_s)
            nanosleep(&poll, NULL);
        else
            sched_yield();
    }
}

static int call(int coll, const void *send, void *recv, int count, MPI_Datatype type,
                MPI_Op op, MPI_Comm comm) {
    switch (coll) {
    /* CALLS */
    default:
        return MPI_ERR_ARG;
    }
}

int ccbench_warm_up(const MPI_Comm *comm, int coll, const void *send, void *recv, int count,
                    const MPI_Datatype *type, const MPI_Op *op, int warmup, int per_call,
                    const barrier_t *how) {
    for (int i = 0; i < warmup; i++) {
        int err = call(coll, send, recv, count, *type, *op, *comm);
        if (err != MPI_SUCCESS) return err;
        if (per_call) {
            err = barrier(*comm, how);
            if (err != MPI_SUCCESS) return err;
        }
    }
    return barrier(*comm, how);
}

int ccbench_timed_per_call(const MPI_Comm *comm, int coll, const void *send, void *recv,
                           int count, const MPI_Datatype *type, const MPI_Op *op,
                           int iterations, double *times, const barrier_t *how) {
    for (int i = 0; i < iterations; i++) {
        double t0 = MPI_Wtime();
        int err = call(coll, send, recv, count, *type, *op, *comm);
        double t1 = MPI_Wtime();
        if (err != MPI_SUCCESS) return err;
        times[i] = t1 - t0;
        err = barrier(*comm, how);
        if (err != MPI_SUCCESS) return err;
    }
    return MPI_SUCCESS;
}

int ccbench_timed_batch(const MPI_Comm *comm, int coll, const void *send, void *recv,
                        int count, const MPI_Datatype *type, const MPI_Op *op,
                        int iterations, double *times, const barrier_t *how) {
    int blocks = iterations < BATCH_BLOCKS ? iterations : BATCH_BLOCKS;
    int base = iterations / blocks, extra = iterations % blocks;
    for (int b = 0; b < blocks; b++) {
        int calls = base + (b < extra ? 1 : 0);
        double t0 = MPI_Wtime();
        for (int i = 0; i < calls; i++) {
            int err = call(coll, send, recv, count, *type, *op, *comm);
            if (err != MPI_SUCCESS) return err;
        }
        double t1 = MPI_Wtime();
        times[b] = (t1 - t0) / calls;
        int err = barrier(*comm, how);
        if (err != MPI_SUCCESS) return err;
    }
    return MPI_SUCCESS;
}
