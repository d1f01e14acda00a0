/* trace.cu - the GPU's own timeline of the kernels a stretch of work ran, for `dsv4 bench --trace FILE` (trace.h).
 *
 * Why: the op profile (op_profile.c) times ops one by one with events between them, so it serializes them and turns
 * programmatic launches off; Nsight Compute times kernels alone. Neither shows a graph replay as it runs: which
 * kernels overlap (the forks, PDL's early starts), the gaps between them, and so which ones are on the critical chain.
 * CUPTI's activity records do: each kernel's start and end as the GPU stamped them, graph nodes included. libcupti is
 * opened with dlopen (it ships with the toolkit, not every runtime image: without it --trace says so and the bench
 * runs on), so no binary links it.
 *
 * Output (appended to the file): "# title", then a line a kernel in start order: start and end in microseconds from
 * the first start, the stream, the graph and node ids (0 outside graphs), grid blocks, threads a block, registers,
 * and the (mangled) name. bench/trace_report.py reads it. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cupti_activity.h>

#include "trace.h"

typedef CUpti_ActivityKernel10 trace_kernel_rec; /* the newest kernel record of the CUDA 13.0 headers */

static decltype(&cuptiActivityEnable) p_enable;
static decltype(&cuptiActivityDisable) p_disable;
static decltype(&cuptiActivityRegisterCallbacks) p_register;
static decltype(&cuptiActivityFlushAll) p_flush;
static decltype(&cuptiActivityGetNextRecord) p_next;
static decltype(&cuptiActivityGetNumDroppedRecords) p_dropped;

typedef struct {
    unsigned long long start, end, graph_node;
    unsigned stream, graph;
    int blocks, threads, regs;
    char *name;
} trace_row;

static trace_row *g_rows; /* filled by the buffer callbacks (a CUPTI thread, or the flush's): under g_mu */
static size_t g_n, g_cap, g_bad;
static int g_oom, g_on;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

#define TRACE_BUF (8u << 20)

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = (uint8_t *)aligned_alloc(8, TRACE_BUF);
    *size = *buf ? TRACE_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&g_mu);
    while (buf && p_next(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const trace_kernel_rec *k = (const trace_kernel_rec *)r;
        if (!k->start || k->end < k->start) { /* no timestamps for this one */
            g_bad++;
            continue;
        }
        if (g_n == g_cap) {
            size_t nc = g_cap ? 2 * g_cap : 4096;
            trace_row *nr = (trace_row *)realloc(g_rows, nc * sizeof *nr);
            if (!nr) {
                g_oom = 1;
                continue;
            }
            g_rows = nr, g_cap = nc;
        }
        trace_row *o = &g_rows[g_n];
        o->name = strdup(k->name ? k->name : "?");
        if (!o->name) {
            g_oom = 1;
            continue;
        }
        o->start = k->start, o->end = k->end, o->stream = k->streamId, o->graph = k->graphId, o->graph_node = k->graphNodeId;
        o->blocks = k->gridX * k->gridY * k->gridZ, o->threads = k->blockX * k->blockY * k->blockZ;
        o->regs = k->registersPerThread;
        g_n++;
    }
    pthread_mutex_unlock(&g_mu);
    free(buf);
}

static int trace_open(char *err, size_t errcap) {
    static int state; /* 0 untried, 1 ok, -1 failed */
    if (state) return state > 0 ? 0 : -1;
    const char *names[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12", "/usr/local/cuda/lib64/libcupti.so",
                           "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"};
    void *h = NULL;
    for (int i = 0; i < 5 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    state = -1;
    if (!h) {
        snprintf(err, errcap, "cannot open libcupti (CUDA's profiling library): %s", dlerror());
        return -1;
    }
#define TF(p_, f_)                                                                                                     \
    if (!(p_ = (decltype(p_))dlsym(h, #f_))) {                                                                         \
        snprintf(err, errcap, "libcupti has no %s", #f_);                                                              \
        return -1;                                                                                                     \
    }
    TF(p_enable, cuptiActivityEnable)
    TF(p_disable, cuptiActivityDisable)
    TF(p_register, cuptiActivityRegisterCallbacks)
    TF(p_flush, cuptiActivityFlushAll)
    TF(p_next, cuptiActivityGetNextRecord)
    TF(p_dropped, cuptiActivityGetNumDroppedRecords)
#undef TF
    if (p_register(buf_requested, buf_completed) != CUPTI_SUCCESS) {
        snprintf(err, errcap, "cuptiActivityRegisterCallbacks failed");
        return -1;
    }
    state = 1;
    return 0;
}

extern "C" int dsv4_cuda_trace_begin(char *err, size_t errcap) {
    if (g_on) {
        snprintf(err, errcap, "a trace is already running");
        return -1;
    }
    if (trace_open(err, errcap)) return -1;
    if (p_enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        snprintf(err, errcap, "cuptiActivityEnable(CONCURRENT_KERNEL) failed (is another profiler attached?)");
        return -1;
    }
    g_on = 1;
    return 0;
}

static int by_start(const void *a, const void *b) {
    const trace_row *x = (const trace_row *)a, *y = (const trace_row *)b;
    return x->start < y->start ? -1 : x->start > y->start;
}

extern "C" int dsv4_cuda_trace_end(FILE *f, const char *title, char *err, size_t errcap) {
    if (!g_on) {
        snprintf(err, errcap, "no trace is running");
        return -1;
    }
    cudaDeviceSynchronize(); /* every kernel recorded has ended */
    p_flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    p_disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    p_flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    g_on = 0;
    size_t dropped = 0;
    p_dropped(NULL, 0, &dropped);
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    if (dropped) {
        snprintf(err, errcap, "CUPTI dropped %zu records (the trace would have holes)", dropped);
        rc = -1;
    } else if (g_oom) {
        snprintf(err, errcap, "out of memory while recording the trace");
        rc = -1;
    } else if (!g_n) {
        snprintf(err, errcap, "the trace recorded no kernel");
        rc = -1;
    } else {
        qsort(g_rows, g_n, sizeof *g_rows, by_start);
        const unsigned long long t0 = g_rows[0].start;
        fprintf(f, "# %s\n# start_us end_us stream graph node blocks threads regs name (%zu records without times left out)\n",
                title, g_bad);
        for (size_t i = 0; i < g_n; i++) {
            const trace_row *r = &g_rows[i];
            fprintf(f, "%.3f %.3f %u %u %llu %d %d %d %s\n", (double)(r->start - t0) * 1e-3, (double)(r->end - t0) * 1e-3,
                    r->stream, r->graph, r->graph_node, r->blocks, r->threads, r->regs, r->name);
        }
        if (fflush(f)) {
            snprintf(err, errcap, "writing the trace failed");
            rc = -1;
        }
    }
    for (size_t i = 0; i < g_n; i++) free(g_rows[i].name);
    g_n = 0, g_oom = 0, g_bad = 0;
    pthread_mutex_unlock(&g_mu);
    return rc;
}
