/* backend.cu - device selection, the error slot, device buffers, streams and weight upload of the
 * CUDA backend (cuda_backend.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_profiler_api.h>
#include "common.cuh"

dsv4_cuda_props dsv4_cuda_dev = {132, 48 * 1024};

static thread_local char g_err[512];

int dsv4_cuda_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

int dsv4_cuda_check_launch(const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return dsv4_cuda_fail("%s: kernel launch failed: %s", op, cudaGetErrorString(e));
    return 0;
}

static int g_pdl_small = -1;
int dsv4_cuda_pdl_small(void) {
    if (g_pdl_small < 0) {
        const char *e = getenv("DSV4_CUDA_PDL_SMALL");
        g_pdl_small = !(e && !strcmp(e, "0"));
    }
    return g_pdl_small;
}
void dsv4_cuda_pdl_small_refused(void) { g_pdl_small = 0; }

static int cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    return dsv4_cuda_fail("%s: %s", what, cudaGetErrorString(e));
}

extern "C" {

const char *dsv4_cuda_last_error(void) { return g_err; }

int dsv4_cuda_init(int dev, dsv4_cuda_info *info, char *err, size_t errcap) {
    cudaDeviceProp p;
    int rc = cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
    if (!rc) rc = cuda_ok(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    if (!rc && p.major < 9) rc = dsv4_cuda_fail("device %d (%s) has compute capability %d.%d; sm_90 is required", dev, p.name, p.major, p.minor);
    if (rc) {
        if (err && errcap) snprintf(err, errcap, "%s", g_err);
        return -1;
    }
    dsv4_cuda_dev.sm_count = p.multiProcessorCount;
    dsv4_cuda_dev.smem_optin = (int)p.sharedMemPerBlockOptin;
    if (info) {
        memset(info, 0, sizeof *info);
        snprintf(info->name, sizeof info->name, "%s", p.name);
        info->cc_major = p.major;
        info->cc_minor = p.minor;
        info->sm_count = p.multiProcessorCount;
        info->l2_bytes = p.l2CacheSize;
        info->smem_optin = (int)p.sharedMemPerBlockOptin;
        cudaMemGetInfo(&info->mem_free, &info->mem_total);
    }
    return 0;
}

void *dsv4_cuda_alloc(size_t bytes) {
    void *p = NULL;
    if (cuda_ok(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc")) return NULL;
    return p;
}

int dsv4_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    return cuda_ok(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

void dsv4_cuda_free(void *p) {
    if (p) cudaFree(p);
}

int dsv4_cuda_upload(void *dst, const void *src, size_t bytes) {
    return cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload");
}

int dsv4_cuda_download(void *dst, const void *src, size_t bytes) {
    return cuda_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download");
}

int dsv4_cuda_memset(void *dst, int byte, size_t bytes, void *stream) {
    return cuda_ok(cudaMemsetAsync(dst, byte, bytes, DSV4_STREAM(stream)), "memset");
}

void *dsv4_cuda_stream_new(void) {
    cudaStream_t s;
    if (cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate")) return NULL;
    return (void *)s;
}

void dsv4_cuda_stream_free(void *stream) {
    if (stream) cudaStreamDestroy(DSV4_STREAM(stream));
}

int dsv4_cuda_stream_sync(void *stream) {
    return cuda_ok(cudaStreamSynchronize(DSV4_STREAM(stream)), "stream sync");
}

void *dsv4_cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cuda_ok(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost")) return NULL;
    return p;
}

void dsv4_cuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

int dsv4_cuda_upload_async(void *dst, const void *src, size_t bytes, void *stream) {
    if (!bytes) return 0;
    return cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, DSV4_STREAM(stream)), "upload");
}

int dsv4_cuda_download_async(void *dst, const void *src, size_t bytes, void *stream) {
    if (!bytes) return 0;
    return cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, DSV4_STREAM(stream)), "download");
}

int dsv4_cuda_capture_begin(void *stream) {
    return cuda_ok(cudaStreamBeginCapture(DSV4_STREAM(stream), cudaStreamCaptureModeRelaxed), "begin capture");
}

int dsv4_cuda_capture_end(void *stream, void **exec) {
    cudaGraph_t gr = NULL;
    cudaGraphExec_t ex = NULL;
    *exec = NULL;
    int rc = cuda_ok(cudaStreamEndCapture(DSV4_STREAM(stream), &gr), "end capture");
    if (!rc) rc = cuda_ok(cudaGraphInstantiate(&ex, gr, 0), "graph instantiate");
    if (gr) cudaGraphDestroy(gr);
    if (rc) {
        cudaGetLastError(); /* clear the (non-sticky) error, so that later launch checks do not report it */
        return -1;
    }
    *exec = (void *)ex;
    return 0;
}

int dsv4_cuda_graph_launch(void *exec, void *stream) {
    return cuda_ok(cudaGraphLaunch((cudaGraphExec_t)exec, DSV4_STREAM(stream)), "graph launch");
}

void dsv4_cuda_graph_free(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

void *dsv4_cuda_event_new(void) {
    cudaEvent_t e;
    if (cuda_ok(cudaEventCreate(&e), "cudaEventCreate")) return NULL;
    return (void *)e;
}

void dsv4_cuda_event_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

int dsv4_cuda_event_record(void *ev, void *stream) {
    return cuda_ok(cudaEventRecord((cudaEvent_t)ev, DSV4_STREAM(stream)), "event record");
}

int dsv4_cuda_stream_wait(void *stream, void *ev) {
    return cuda_ok(cudaStreamWaitEvent(DSV4_STREAM(stream), (cudaEvent_t)ev, 0), "stream wait");
}

void dsv4_cuda_profiler_range(int on) {
    (void)(on ? cudaProfilerStart() : cudaProfilerStop()); /* no-ops without a profiler attached */
}

double dsv4_cuda_event_ms(void *e0, void *e1) {
    float ms = -1;
    if (cuda_ok(cudaEventSynchronize((cudaEvent_t)e1), "event sync") ||
        cuda_ok(cudaEventElapsedTime(&ms, (cudaEvent_t)e0, (cudaEvent_t)e1), "event time"))
        return -1;
    return ms;
}

/* Bytes of stored rows [0, nrows) of data, and of their scale rows. */
static void weight_extent(const dsv4_weight *w, int64_t nrows, size_t *data_b, size_t *scale_b) {
    int64_t C = w->cols;
    *scale_b = 0;
    switch (w->fmt) {
    case DSV4_WF_F32: *data_b = (size_t)(nrows * C * 4); break;
    case DSV4_WF_BF16:
    case DSV4_WF_F16: *data_b = (size_t)(nrows * C * 2); break;
    case DSV4_WF_FP8:
        *data_b = (size_t)(nrows * C);
        *scale_b = (size_t)(((nrows + 127) / 128) * w->scale_stride * (w->scale_f32 ? 4 : 1));
        break;
    case DSV4_WF_MXFP4:
    case DSV4_WF_NVFP4:
        *data_b = (size_t)(nrows * (C / 2));
        *scale_b = (size_t)(nrows * w->scale_stride);
        break;
    default: *data_b = 0;
    }
}

int dsv4_cuda_weight_upload(const dsv4_weight *w, dsv4_cuda_weight *out) {
    memset(out, 0, sizeof *out);
    if ((unsigned)w->fmt >= DSV4_WF_COUNT) return dsv4_cuda_fail("weight %s: unknown format", w->name ? w->name : "?");
    size_t db, sb;
    weight_extent(w, (int64_t)w->row0 + w->rows, &db, &sb);
    uint8_t *d = (uint8_t *)dsv4_cuda_alloc(db), *s = sb ? (uint8_t *)dsv4_cuda_alloc(sb) : NULL;
    if (!d || (sb && !s) || dsv4_cuda_upload(d, w->data, db) || (sb && dsv4_cuda_upload(s, w->scale, sb))) {
        dsv4_cuda_free(d);
        dsv4_cuda_free(s);
        return -1;
    }
    out->fmt = w->fmt;
    out->rows = w->rows;
    out->cols = w->cols;
    out->row0 = w->row0;
    out->data = d;
    out->scale = s;
    out->scale_f32 = w->scale_f32;
    out->scale_stride = w->scale_stride;
    out->scale2 = w->scale2;
    out->act_quant = w->act_quant;
    dsv4_cuda_weight_f16_fit(w, out);
    return 0;
}

void dsv4_cuda_weight_f16_fit(const dsv4_weight *w, dsv4_cuda_weight *d) {
    d->f16_ok = d->f16_shift = 0;
    if (w->fmt != DSV4_WF_FP8 || w->scale_f32 || !w->scale || w->rows <= 0 || w->cols <= 0) return;
    int kmin = 1000, kmax = -1000;
    for (int b = w->row0 / 128; b <= (w->row0 + w->rows - 1) / 128; b++)
        for (int c = 0; c < (w->cols + 127) / 128; c++) {
            const uint8_t e = w->scale[(int64_t)b * w->scale_stride + c];
            if (e == 0xff) return; /* NaN */
            kmin = e - 127 < kmin ? e - 127 : kmin;
            kmax = e - 127 > kmax ? e - 127 : kmax;
        }
    /* codes 2^-9 (subnormal) .. 448 < 2^9: 2^(kmin - shift - 9) >= 2^-24 and 448 x 2^(kmax - shift) <= 65504 */
    if (kmax - kmin > 22) return;
    d->f16_shift = kmax - 7, d->f16_ok = 1;
}

void dsv4_cuda_weight_free(dsv4_cuda_weight *w) {
    dsv4_cuda_free((void *)w->data);
    dsv4_cuda_free((void *)w->scale);
    memset(w, 0, sizeof *w);
}

} /* extern "C" */
