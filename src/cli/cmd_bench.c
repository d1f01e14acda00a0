/* cmd_bench.c - `dsv4 bench`: decode and prefill speed at the real DeepSeek-V4 Flash / Pro layer
 * shapes without a checkpoint, against the memory roofline of the same run (issue 5).
 *
 * It writes a synthetic checkpoint with the released shapes for the first --layers layers
 * (src/bench/bench_model.c: a temporary model directory, filled by all threads, reused when the
 * same one is asked for again), loads it through the public API (dsv4_load, dsv4_set_device) and
 * times dsv4_forward with the wall clock (the GPU forward is synchronous: it returns after its
 * last copy). Decode: for each context C and batch B, B sequences are prefilled to C tokens (in
 * chunks), then steps alternate logits for the last token (head included) and no logits (the
 * layers alone), --steps of each. On the GPU a decode step is two CUDA graphs (layers, head); the
 * step and layers times are then the medians of --replays replays of those graphs timed with CUDA
 * events (the last step's input replayed: only the GPU's time), and the wall-clock median of the
 * dsv4_forward calls (upload, graphs, logits download, host work) is reported as "call ms". Without
 * graphs (CPU, DSV4_CUDA_GRAPHS=0) step and layers are the wall-clock medians. The roofline is the minimum bytes a step must
 * read (dense weights of the layers, the routed experts the step touches, the head, KV and indexer
 * keys in the reference's cache formats) over the device-to-device copy bandwidth measured in the
 * same run. The projection to the whole model is (layers time / N) x n_layers + head time. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench/bench_model.h"
#include "cmds.h"
#include "dsv4.h"
#ifdef DSV4_CUDA
#include "cuda/bench_cuda.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_model.h"
#include "cuda/trace.h"
#include "model/model.h"
#endif

#define MAXL 16
#define NTYPES 8 /* layer types of an op profile's split */
#ifdef DSV4_CUDA
_Static_assert(DSV4_PROF_MAXTYPES <= NTYPES, "a profile split has more layer types than dec_res holds");
#endif

typedef struct {
    const char *synthetic, *experts, *dir, *device, *json_file, *trace;
    int layers, prompt, steps, chunk, json, keep, reps, replays, profile, fill_prefill;
    int batch[MAXL], nbatch, context[MAXL], ncontext;
    unsigned long long seed;
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: dsv4 bench --synthetic flash|pro [options]\n"
            "\n"
            "  Measures decode step time and prefill speed of the engine on a synthetic checkpoint with the\n"
            "  real DeepSeek-V4 layer shapes (random weights in the release formats, fixed seed; routing is\n"
            "  whatever the random gate gives), next to the memory roofline of the same run: the bytes a\n"
            "  decode step must read at least / the measured device-to-device copy bandwidth. Projects the\n"
            "  per-layer times to the whole model (43 layers Flash, 61 Pro). --device cuda (the default) needs a\n"
            "  CUDA build (make CUDA=1; a CPU-only build says so and exits 2); --device cpu runs anywhere.\n"
            "\n"
            "  --synthetic NAME   flash, pro (released shapes) or tiny (toy widths, for testing)\n"
            "  --layers N         first N layers of the released config (default 4; compress ratios and\n"
            "                     hash-routed layers as released)\n"
            "  --experts FMT      routed expert format: mxfp4 (default, as released) or nvfp4\n"
            "  --batch LIST       decode batch sizes, comma-separated (default 1)\n"
            "  --context LIST     context lengths for decode, comma-separated (default 4096)\n"
            "  --prompt LEN       prefill measurement: one prompt of LEN tokens (default 2048; 0 = skip)\n"
            "  --steps N          timed decode steps of each kind (default 20)\n"
            "  --replays N        GPU: replays of the decode step's CUDA graphs timed (default 200)\n"
            "  --chunk N          prefill chunk when filling the context (default 2048)\n"
            "  --fill HOW         fork (default): the first sequence of a batch is prefilled to the context,\n"
            "                     the others are forks of it (dsv4_seq_fork: a copy of its caches; a step\n"
            "                     reads the same bytes, so batch 256 at 8K fills in seconds); prefill: every\n"
            "                     sequence prefilled with its own random tokens\n"
            "  --seed N           weight seed (default 0)\n"
            "  --dir DIR          where the checkpoint goes (default $TMPDIR or /tmp,\n"
            "                     dsv4-bench-NAME-NL-FMT-sSEED; reused if complete)\n"
            "  --keep             keep the checkpoint afterwards (default: removed)\n"
            "  --device DEV       cuda (default) or cpu (the float32 reference; only sensible with tiny)\n"
            "  --json             one JSON object on stdout instead of the tables\n"
            "  --json-file FILE   the tables on stdout and the JSON object into FILE\n"
            "  --profile          GPU: also a table per op of one prefill and of each decode step (run without\n"
            "                     graphs, an event after every op; stdout, stderr with --json)\n"
            "  --trace FILE       GPU: write the timeline of one more prefill and of 5 more replays of each\n"
            "                     decode step's graphs to FILE (every kernel's start and end as the GPU ran it,\n"
            "                     overlap and programmatic launches included; CUPTI, opened at run time); read it\n"
            "                     with python3 bench/trace_report.py FILE. CUPTI stays attached once a trace ran:\n"
            "                     the run's own timings are not comparable with an untraced run's\n");
}

static int parse_list(const char *s, int *out, int *n) {
    *n = 0;
    while (*s) {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s || v < 1 || v > 100000000 || *n >= MAXL) return -1;
        out[(*n)++] = (int)v;
        s = e;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return *n ? 0 : -1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    if (n < 1) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#ifdef DSV4_CUDA
/* Whole-model layers time from the measured layers time t of the N measured layers, split by layer type as an op
 * profile splits it (n types: compress ratio[k], ms[k]; other_ms: the layers part outside any layer): one layer of
 * type k takes t * ms[k] / total / (its count among the measured layers), a type not measured the measured layers'
 * average; summed over the released model's layers, plus the outside share. The per-type times go to tt (if not
 * NULL). -1 when the split is empty. n <= NTYPES (the static assertion above). */
static double proj_layers(double t, int n, const int *ratio, const double *ms, double other_ms, const dsv4_bench_shape *s,
                          int N, double *tt) {
    double total = other_ms;
    for (int k = 0; k < n; k++) total += ms[k];
    if (!(total > 0)) return -1;
    const double f = t / total, avg = (t - f * other_ms) / N;
    double per[NTYPES];
    for (int k = 0; k < n; k++) {
        int cnt = 0;
        for (int L = 0; L < N; L++) cnt += s->ratio[L] == ratio[k];
        per[k] = cnt ? f * ms[k] / cnt : avg;
        if (tt) tt[k] = per[k];
    }
    double proj = f * other_ms;
    for (int L = 0; L < s->n_layers_full; L++) {
        int k = 0;
        while (k < n && ratio[k] != s->ratio[L]) k++;
        proj += k < n ? per[k] : avg;
    }
    return proj;
}
#endif

static uint64_t g_rng = 0x1234567ull;
static int32_t rand_tok(int V) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)(2 + (g_rng >> 33) % (uint64_t)(V - 2));
}

static void rm_dir(const char *dir) {
    static const char *files[] = {"model.safetensors", "config.json", ".dsv4-bench-complete"};
    char p[4200];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        remove(p);
    }
    remove(dir);
}

/* one decode measurement */
typedef struct {
    int batch, context;
    double t_step, t_layers, t_head;  /* medians, seconds (graph replays on the GPU) */
    double t_call;                    /* wall-clock median of the dsv4_forward calls with logits */
    int graph;                        /* step / layers timed from graph replays */
    double bytes, bytes_dense, bytes_experts, bytes_head, bytes_kv, kv_engine, uniq;
    double roof, ratio;
    double proj_step, proj_bytes, proj_roof, proj_ratio;
    int ntypes, type_ratio[NTYPES];  /* per layer type (compress ratio): time of one such layer, seconds */
    double t_type[NTYPES];                 /* (the replay's layers time split as the op profile splits it) */
} dec_res;

/* cJSON members; *bad set when one cannot be added (out of memory; cJSON's Add* on a NULL object fail too) */
static void jnum(cJSON *o, const char *k, double v, int *bad) { *bad |= !cJSON_AddNumberToObject(o, k, v); }
static void jstr(cJSON *o, const char *k, const char *v, int *bad) { *bad |= !cJSON_AddStringToObject(o, k, v ? v : ""); }

/* The run's report as one JSON object (--json / --json-file; the keys of the tables); NULL when out of memory. Every
 * member is attached to the report as it is made, so the report is the only tree to delete. */
static cJSON *bench_json(const dsv4_bench_shape *s, int N, const opts *o, const char *gpu, double t_gen, double t_load,
                         double t_up, double bw, int gm, int gn, int gk, double gemm_us, double gemm_tflops, double pf_t,
                         double pf_tflops, double pf_proj, int pf_rows, const dec_res *res, int nres) {
    int bad = 0;
    cJSON *r = cJSON_CreateObject();
    jstr(r, "model", s->name, &bad), jnum(r, "layers", N, &bad), jnum(r, "layers_full", s->n_layers_full, &bad);
    jstr(r, "experts", o->experts, &bad), jnum(r, "seed", (double)o->seed, &bad), jstr(r, "device", o->device, &bad);
    jstr(r, "gpu", gpu, &bad), jnum(r, "generate_s", t_gen, &bad), jnum(r, "load_s", t_load, &bad);
    jnum(r, "upload_s", t_up, &bad), jnum(r, "d2d_GBps", bw, &bad);
    cJSON *g = cJSON_AddObjectToObject(r, "fp8_gemm");
    jnum(g, "m", gm, &bad), jnum(g, "n", gn, &bad), jnum(g, "k", gk, &bad), jnum(g, "us", gemm_us, &bad);
    jnum(g, "tflops", gemm_tflops, &bad);
    cJSON *pf = cJSON_AddObjectToObject(r, "prefill");
    jnum(pf, "tokens", o->prompt, &bad), jnum(pf, "ms", pf_t * 1e3, &bad);
    jnum(pf, "tokens_per_s", pf_t > 0 ? o->prompt / pf_t : 0, &bad), jnum(pf, "tflops", pf_tflops, &bad);
    jnum(pf, "proj_tokens_per_s", pf_proj > 0 ? o->prompt / pf_proj : 0, &bad), jnum(pf, "pass_rows", pf_rows, &bad);
    cJSON *dec = cJSON_AddArrayToObject(r, "decode");
    for (int i = 0; dec && i < nres; i++) {
        const dec_res *R = &res[i];
        cJSON *d = cJSON_CreateObject();
        if (!cJSON_AddItemToArray(dec, d)) {
            cJSON_Delete(d);
            bad = 1;
            break;
        }
        jnum(d, "batch", R->batch, &bad), jnum(d, "context", R->context, &bad);
        jstr(d, "timing", R->graph ? "graph replay median" : "wall clock median", &bad);
        jnum(d, "step_ms", R->t_step * 1e3, &bad), jnum(d, "layers_ms", R->t_layers * 1e3, &bad);
        jnum(d, "head_ms", R->t_head * 1e3, &bad), jnum(d, "call_ms", R->t_call * 1e3, &bad);
        jnum(d, "unique_experts", R->uniq, &bad), jnum(d, "bytes", R->bytes, &bad);
        jnum(d, "bytes_dense", R->bytes_dense, &bad), jnum(d, "bytes_experts", R->bytes_experts, &bad);
        jnum(d, "bytes_head", R->bytes_head, &bad), jnum(d, "bytes_kv", R->bytes_kv, &bad);
        jnum(d, "bytes_kv_engine_fp32", R->kv_engine, &bad), jnum(d, "roofline_ms", R->roof * 1e3, &bad);
        jnum(d, "ratio", R->ratio, &bad), jnum(d, "proj_step_ms", R->proj_step * 1e3, &bad);
        jnum(d, "proj_bytes", R->proj_bytes, &bad), jnum(d, "proj_roofline_ms", R->proj_roof * 1e3, &bad);
        jnum(d, "proj_ratio", R->proj_ratio, &bad);
        jnum(d, "proj_tokens_per_s", R->proj_step > 0 ? R->batch / R->proj_step : 0, &bad);
        cJSON *bt = cJSON_AddObjectToObject(d, "layer_ms_by_ratio");
        for (int k = 0; k < R->ntypes; k++) {
            char key[16];
            snprintf(key, sizeof key, "%d", R->type_ratio[k]);
            jnum(bt, key, R->t_type[k] * 1e3, &bad);
        }
        bad |= !bt;
    }
    if (bad || !g || !pf || !dec) {
        cJSON_Delete(r);
        return NULL;
    }
    return r;
}

/* multiply-adds of attention (QK + PV) and of the indexer scores for one query at position p */
static double attn_macs(const dsv4_bench_shape *s, int L, long p) {
    long n = p + 1 < s->window ? p + 1 : s->window, ki = 0;
    int r = s->ratio[L];
    if (r == 4) {
        ki = (p + 1) / 4;
        n += ki < s->idx_topk ? ki : s->idx_topk;
    } else if (r > 0) {
        n += (p + 1) / r;
    }
    return 2.0 * s->n_heads * s->head_dim * (double)n + (double)s->idx_heads * s->idx_dim * (double)ki;
}

static int prefill_seq(dsv4_model *m, dsv4_seq *sq, int n, int chunk, int V, char *err, size_t cap) {
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)chunk);
    if (!tok) return snprintf(err, cap, "out of memory"), -1;
    dsv4_seq_set_prefill(sq, n);
    for (int done = 0; done < n;) {
        int k = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < k; i++) tok[i] = rand_tok(V);
        const int32_t *tp = tok;
        if (dsv4_forward(m, 1, &sq, &tp, &k, NULL, DSV4_LOGITS_NONE, err, cap)) {
            free(tok);
            return -1;
        }
        done += k;
    }
    free(tok);
    return 0;
}

#ifdef DSV4_CUDA
/* --trace: starts recording (1), or on a failure says so and closes *tf: no more traces (0) */
static int trace_begin(FILE **tf) {
    char err[256];
    if (!*tf) return 0;
    if (!dsv4_cuda_trace_begin(err, sizeof err)) return 1;
    fprintf(stderr, "dsv4 bench: --trace: %s (no trace)\n", err);
    fclose(*tf), *tf = NULL;
    return 0;
}
/* --trace: the recorded timeline appended to *tf under title; on a failure a message, and no more traces */
static int g_traces; /* sections written */
static void trace_done(FILE **tf, const char *title) {
    char err[256];
    if (dsv4_cuda_trace_end(*tf, title, err, sizeof err)) {
        fprintf(stderr, "dsv4 bench: --trace: %s (no more traces)\n", err);
        fclose(*tf), *tf = NULL;
    } else
        g_traces++;
}
#endif

int dsv4_cmd_bench(int argc, char **argv) {
    opts o = {.experts = "mxfp4", .device = "cuda", .layers = 4, .prompt = 2048, .steps = 20, .chunk = 2048,
              .reps = 3, .replays = 200};
    o.batch[0] = 1, o.nbatch = 1, o.context[0] = 4096, o.ncontext = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) { fprintf(stderr, "dsv4 bench: %s needs a value\n", a); return 2; } i++; } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--synthetic")) {
            NEEDV();
            o.synthetic = v;
        } else if (!strcmp(a, "--layers")) {
            NEEDV();
            o.layers = atoi(v);
        } else if (!strcmp(a, "--experts")) {
            NEEDV();
            o.experts = v;
        } else if (!strcmp(a, "--batch") || !strcmp(a, "--context")) {
            NEEDV();
            int bad = !strcmp(a, "--batch") ? parse_list(v, o.batch, &o.nbatch) : parse_list(v, o.context, &o.ncontext);
            if (bad) {
                fprintf(stderr, "dsv4 bench: %s wants a comma-separated list of positive integers (at most %d)\n", a, MAXL);
                return 2;
            }
        } else if (!strcmp(a, "--prompt")) {
            NEEDV();
            o.prompt = atoi(v);
        } else if (!strcmp(a, "--steps")) {
            NEEDV();
            o.steps = atoi(v);
        } else if (!strcmp(a, "--replays")) {
            NEEDV();
            o.replays = atoi(v);
        } else if (!strcmp(a, "--chunk")) {
            NEEDV();
            o.chunk = atoi(v);
        } else if (!strcmp(a, "--fill")) {
            NEEDV();
            if (strcmp(v, "fork") && strcmp(v, "prefill")) {
                fprintf(stderr, "dsv4 bench: --fill must be fork or prefill\n");
                return 2;
            }
            o.fill_prefill = !strcmp(v, "prefill");
        } else if (!strcmp(a, "--seed")) {
            NEEDV();
            o.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--dir")) {
            NEEDV();
            o.dir = v;
        } else if (!strcmp(a, "--device")) {
            NEEDV();
            o.device = v;
        } else if (!strcmp(a, "--json-file")) {
            NEEDV();
            o.json_file = v;
        } else if (!strcmp(a, "--keep")) {
            o.keep = 1;
        } else if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--profile")) {
            o.profile = 1;
        } else if (!strcmp(a, "--trace")) {
            NEEDV();
            o.trace = v;
        } else {
            fprintf(stderr, "dsv4 bench: unknown option '%s' (dsv4 bench --help)\n", a);
            return 2;
        }
#undef NEEDV
    }
    dsv4_bench_shape s;
    if (!o.synthetic || dsv4_bench_shape_get(o.synthetic, &s)) {
        fprintf(stderr, "dsv4 bench: --synthetic flash|pro|tiny is required (no checkpoint is read)\n");
        return 2;
    }
    int nvfp4 = !strcmp(o.experts, "nvfp4");
    if (!nvfp4 && strcmp(o.experts, "mxfp4")) {
        fprintf(stderr, "dsv4 bench: --experts must be mxfp4 or nvfp4\n");
        return 2;
    }
    if (o.layers < 1 || o.layers > s.n_layers_full || o.prompt < 0 || o.steps < 1 || o.chunk < 1 || o.replays < 1) {
        fprintf(stderr, "dsv4 bench: --layers must be in [1, %d], --steps, --replays and --chunk >= 1, --prompt >= 0\n",
                s.n_layers_full);
        return 2;
    }
    int cuda = !strcmp(o.device, "cuda");
    if (!cuda && strcmp(o.device, "cpu")) {
        fprintf(stderr, "dsv4 bench: --device must be cuda or cpu\n");
        return 2;
    }
    if (o.trace && !cuda) {
        fprintf(stderr, "dsv4 bench: --trace records GPU kernels: it needs --device cuda\n");
        return 2;
    }
#ifndef DSV4_CUDA
    if (cuda) {
        fprintf(stderr, "dsv4 bench: this build has no CUDA backend (build with make CUDA=1); "
                        "--device cpu runs the float32 reference instead (only sensible with --synthetic tiny)\n");
        return 2;
    }
#endif

    /* 1. the checkpoint */
    char dir[4096], marker[4200], want[256];
    if (o.dir) snprintf(dir, sizeof dir, "%s", o.dir);
    else
        snprintf(dir, sizeof dir, "%s/dsv4-bench-%s-%dL-%s-s%llu", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
                 s.name, o.layers, o.experts, o.seed);
    snprintf(marker, sizeof marker, "%s/.dsv4-bench-complete", dir);
    /* v2: wo_a in FP8 (a v1 checkpoint held it in bf16) */
    snprintf(want, sizeof want, "%s %d %s %llu v2\n", s.name, o.layers, o.experts, o.seed);
    int reuse = 0;
    FILE *mf = fopen(marker, "r");
    if (mf) {
        char got[256] = {0};
        reuse = fgets(got, sizeof got, mf) && !strcmp(got, want);
        fclose(mf);
    }
    double t0 = now(), t_gen = 0, t_load = 0, t_up = 0;
    uint64_t file_bytes = 0;
    if (!reuse) {
        if (mkdir(dir, 0777) && errno != EEXIST) {
            fprintf(stderr, "dsv4 bench: %s: cannot create: %s\n", dir, strerror(errno));
            return 1;
        }
        remove(marker);
        dsv4_err e = {{0}};
        fprintf(stderr, "dsv4 bench: writing a synthetic %s checkpoint (%d layers, %s experts) to %s\n", s.name,
                o.layers, o.experts, dir);
        if (dsv4_bench_write(dir, &s, o.layers, nvfp4, o.seed, &file_bytes, &e)) {
            fprintf(stderr, "dsv4 bench: %s\n", e.msg);
            return 1;
        }
        mf = fopen(marker, "w");
        if (mf) fputs(want, mf), fclose(mf);
        t_gen = now() - t0;
        fprintf(stderr, "dsv4 bench: wrote %.2f GB in %.1f s\n", file_bytes / 1e9, t_gen);
    }
    char err[1024] = {0};
    dsv4_model *m = NULL;
    t0 = now();
    if (dsv4_load(dir, &m, err, sizeof err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err);
        return 1;
    }
    t_load = now() - t0;
    /* a context capacity that holds the longest measured sequence (the GPU allocates it per sequence) */
    long need = o.prompt;
    for (int i = 0; i < o.ncontext; i++)
        if (o.context[i] + 2L * o.steps + 8 > need) need = o.context[i] + 2L * o.steps + 8;
    if (need > DSV4_GPU_DEFAULT_CONTEXT && dsv4_set_max_context(m, (int)need, err, sizeof err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err);
        dsv4_free(m);
        return 1;
    }
    t0 = now();
    if (dsv4_set_device(m, o.device, err, sizeof err)) {
        fprintf(stderr, "dsv4 bench: %s\n", err);
        dsv4_free(m);
        return 1;
    }
    t_up = now() - t0;
    const int V = s.vocab, N = o.layers;
#ifdef DSV4_CUDA
    FILE *tf = NULL; /* --trace */
    if (o.trace && !(tf = fopen(o.trace, "w"))) {
        fprintf(stderr, "dsv4 bench: --trace %s: cannot create: %s\n", o.trace, strerror(errno));
        dsv4_free(m);
        return 1;
    }
#endif

    /* 2. reference measurements of this device */
    double bw = 0, gemm_us = 0;
    int gm = s.n_heads * s.head_dim, gk = s.q_lora, gn = o.prompt > 0 ? o.prompt : 2048;
    char gpu[320] = "cpu";
#ifdef DSV4_CUDA
    if (cuda) {
        dsv4_cuda_info info;
        if (!dsv4_cuda_init(0, &info, err, sizeof err)) snprintf(gpu, sizeof gpu, "%.200s (%d SMs, %.1f GiB)", info.name, info.sm_count, info.mem_total / 1073741824.0);
        if (dsv4_cuda_bench_d2d((size_t)1 << 30, 20, &bw, err, sizeof err))
            fprintf(stderr, "dsv4 bench: d2d copy: %s\n", err), bw = 0;
        if (dsv4_cuda_bench_fp8_gemm(gm, gn, gk, 20, &gemm_us, err, sizeof err))
            fprintf(stderr, "dsv4 bench: cuBLASLt FP8 GEMM: %s\n", err), gemm_us = 0;
    }
#endif

    /* byte / multiply-add model of every layer of the released model */
    dsv4_bench_bytes lb[64];
    for (int L = 0; L < s.n_layers_full; L++) dsv4_bench_layer_bytes(&s, L, nvfp4, &lb[L]);
    const double head_bytes = lb[0].head;

    /* 3. prefill */
    double pf_t = 0, pf_tflops = 0, pf_macs = 0, pf_proj = 0; /* pf_proj: whole-model prefill seconds */
    int pf_rows = 0;                                             /* the rows of a prefill pass (0: one call) */
    const char *pf_how = "measured layers' average";
#ifdef DSV4_CUDA
    dsv4_cuda_prof_split pf_split = {0};
#endif
    if (o.prompt > 0) {
        double ts[8];
        int nr = o.reps;
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)o.prompt);
        float *lg = malloc(sizeof(float) * (size_t)V);
        if (!tok || !lg) {
            fprintf(stderr, "dsv4 bench: out of memory\n");
            return 1;
        }
        int nrun = nr;
#ifdef DSV4_CUDA
        if (cuda) nrun++; /* one more run, profiled (the split by layer type; the table with --profile), not timed */
        const int rtrace = cuda && tf ? ++nrun : -1; /* and with --trace one more, traced */
#endif
        for (int r = 0; r <= nrun; r++) { /* r = 0: warm-up (workspaces grow) */
            dsv4_seq *sq = dsv4_seq_new(m);
            if (!sq) {
                fprintf(stderr, "dsv4 bench: out of memory (sequence)\n");
                return 1;
            }
            dsv4_seq_set_prefill(sq, o.prompt);
            for (int i = 0; i < o.prompt; i++) tok[i] = rand_tok(V);
            const int32_t *tp = tok;
            int n = o.prompt;
#ifdef DSV4_CUDA
            if (r == nr + 1) dsv4_cuda_profile_open(m->gpu);
            const int traced = r == rtrace && trace_begin(&tf);
#endif
            double a = now();
            if (dsv4_forward(m, 1, &sq, &tp, &n, lg, DSV4_LOGITS_LAST, err, sizeof err)) {
                fprintf(stderr, "dsv4 bench: prefill: %s\n", err);
                return 1;
            }
            if (r && r <= nr) ts[r - 1] = now() - a;
#ifdef DSV4_CUDA
            if (r == nr + 1) {
                char title[64];
                snprintf(title, sizeof title, "prefill of %d tokens", o.prompt);
                dsv4_cuda_profile_close(m->gpu, o.profile ? (o.json ? stderr : stdout) : NULL, title, &pf_split);
            }
            if (traced) {
                char title[96];
                snprintf(title, sizeof title, "prefill of %d tokens (%s, %d layers)", o.prompt, s.name, N);
                trace_done(&tf, title);
            }
#endif
            dsv4_seq_free(sq);
        }
        free(tok);
        free(lg);
        pf_t = median(ts, nr);
        for (int L = 0; L < N; L++) {
            pf_macs += (lb[L].dense_macs + s.n_active * lb[L].expert_macs) * o.prompt;
            for (long p = 0; p < o.prompt; p++) pf_macs += attn_macs(&s, L, p);
        }
        pf_macs += lb[0].head_macs; /* one row of logits */
        pf_tflops = 2 * pf_macs / pf_t / 1e12;
        pf_proj = pf_t / N * s.n_layers_full;
#ifdef DSV4_CUDA
        /* per layer type, as for decode below; the head's share (one row) stays in "other" */
        double pp = proj_layers(pf_t, pf_split.n, pf_split.ratio, pf_split.ms, pf_split.other_ms, &s, N, NULL);
        if (pp > 0) pf_proj = pp, pf_how = "by layer type";
#endif
        if (!o.json)
            fprintf(stderr, "dsv4 bench: prefill %d tokens: %.1f ms\n", o.prompt, pf_t * 1e3);
        /* the rows of a pass (a GPU's workspace; 0: one call, the CPU): the prefill's speed depends on it (tokens an
         * expert), and the default differs between GPUs (bench/NOTES.md "Session 49") */
        long fit;
        if (dsv4_device_limits(m, &pf_rows, &fit)) pf_rows = 0;
    }

    /* 4. decode */
    dec_res res[MAXL * MAXL];
    int nres = 0;
    for (int ci = 0; ci < o.ncontext; ci++)
        for (int bi = 0; bi < o.nbatch; bi++) {
            int B = o.batch[bi], C = o.context[ci];
            dec_res *R = &res[nres++];
            memset(R, 0, sizeof *R);
            R->batch = B, R->context = C;
            dsv4_seq **sq = calloc((size_t)B, sizeof *sq);
            int32_t *tok = malloc(sizeof(int32_t) * (size_t)B);
            const int32_t **tp = malloc(sizeof *tp * (size_t)B);
            int *nt = malloc(sizeof(int) * (size_t)B);
            float *lg = malloc(sizeof(float) * (size_t)V * B);
            double *tl = malloc(sizeof(double) * (size_t)o.steps), *tn = malloc(sizeof(double) * (size_t)o.steps);
            if (!sq || !tok || !tp || !nt || !lg || !tl || !tn) {
                fprintf(stderr, "dsv4 bench: out of memory\n");
                return 1;
            }
            double a = now();
            for (int b = 0; b < B; b++) {
                if (b > 0 && !o.fill_prefill) {
                    if (!(sq[b] = dsv4_seq_fork(sq[0]))) {
                        fprintf(stderr, "dsv4 bench: out of memory (sequence %d)\n", b);
                        return 1;
                    }
                } else if (!(sq[b] = dsv4_seq_new(m))) {
                    fprintf(stderr, "dsv4 bench: out of memory (sequence)\n");
                    return 1;
                } else if (prefill_seq(m, sq[b], C, o.chunk, V, err, sizeof err)) {
                    fprintf(stderr, "dsv4 bench: filling the context: %s\n", err);
                    return 1;
                }
                tp[b] = &tok[b];
                nt[b] = 1;
            }
            if (!o.json)
                fprintf(stderr, "dsv4 bench: batch %d context %d: filled in %.1f s\n", B, C, now() - a);
            for (int i = -4; i < 2 * o.steps; i++) { /* 4 warm-up steps, then LAST / NONE alternating */
                for (int b = 0; b < B; b++) tok[b] = rand_tok(V);
                int mode = (i & 1) ? DSV4_LOGITS_NONE : DSV4_LOGITS_LAST;
                double t = now();
                if (dsv4_forward(m, B, sq, tp, nt, lg, mode, err, sizeof err)) {
                    fprintf(stderr, "dsv4 bench: decode: %s\n", err);
                    return 1;
                }
                t = now() - t;
                if (i >= 0) (mode == DSV4_LOGITS_LAST ? tl : tn)[i / 2] = t;
            }
            R->t_step = R->t_call = median(tl, o.steps);
            R->t_layers = median(tn, o.steps);
#ifdef DSV4_CUDA
            double rl, rs; /* the last step was one of this batch: replay its graphs */
            if (cuda && !dsv4_cuda_decode_replay_ms(m->gpu, B, o.replays, &rl, &rs)) {
                R->t_layers = rl * 1e-3;
                R->t_step = rs * 1e-3;
                R->graph = 1;
                if (trace_begin(&tf)) { /* --trace: 5 more replays, traced */
                    double tl5, ts5;
                    char title[128];
                    snprintf(title, sizeof title, "decode batch %d context %d (%s, %d layers): 5 replays of the layers and head graphs",
                             B, C, s.name, N);
                    if (dsv4_cuda_decode_replay_ms(m->gpu, B, 5, &tl5, &ts5))
                        fprintf(stderr, "dsv4 bench: --trace: the traced replays failed\n");
                    trace_done(&tf, title);
                }
            }
            /* the op profile splits the layers' time by layer type for the whole-model projection (its table: --profile) */
            dsv4_cuda_prof_split sp;
            int have_split = 0;
            if (cuda) {
                if (dsv4_cuda_decode_profile(m->gpu, B, o.profile ? 5 : 3, o.profile ? (o.json ? stderr : stdout) : NULL, &sp))
                    fprintf(stderr, "dsv4 bench: the decode profile failed (projection by layer average)\n");
                else
                    have_split = 1;
                unsigned long long tk[3]; /* the indexer top-k's rows since the last batch (steps, replays, profile) */
                if (!dsv4_cuda_topk_counts(tk, 1) && tk[0])
                    fprintf(stderr, "dsv4 bench: batch %d context %d: indexer top-k rows %llu, with order ties only %llu, "
                                    "with boundary ties %llu (the one-thread path)\n", B, C, tk[0], tk[1], tk[2]);
            }
#endif
            R->t_head = R->t_step - R->t_layers;
            /* bytes: the N measured layers + head */
            const double E = s.n_experts, K = s.n_active;
            R->uniq = E * (1 - pow(1 - K / E, B));
            for (int L = 0; L < s.n_layers_full; L++) {
                double eng, kv = B * dsv4_bench_kv_bytes(&s, L, C, &eng);
                double dense = lb[L].dense, ex = R->uniq * lb[L].expert;
                if (L < N) {
                    R->bytes_dense += dense, R->bytes_experts += ex, R->bytes_kv += kv, R->kv_engine += B * eng;
                }
                R->proj_bytes += dense + ex + kv;
            }
            R->bytes_head = head_bytes;
            R->bytes = R->bytes_dense + R->bytes_experts + R->bytes_kv + head_bytes;
            R->proj_bytes += head_bytes;
            R->proj_step = R->t_layers / N * s.n_layers_full + R->t_head;
#ifdef DSV4_CUDA
            if (have_split) { /* per-layer time by type x the whole model's layer counts */
                double pl = proj_layers(R->t_layers, sp.n, sp.ratio, sp.ms, sp.other_ms, &s, N, R->t_type);
                if (pl > 0) {
                    R->ntypes = sp.n;
                    for (int k = 0; k < sp.n; k++) R->type_ratio[k] = sp.ratio[k];
                    R->proj_step = pl + R->t_head;
                }
            }
#endif
            if (bw > 0) {
                R->roof = R->bytes / (bw * 1e9);
                R->ratio = R->t_step / R->roof;
                R->proj_roof = R->proj_bytes / (bw * 1e9);
                R->proj_ratio = R->proj_step / R->proj_roof;
            }
            for (int b = 0; b < B; b++) dsv4_seq_free(sq[b]);
            free(sq), free(tok), free(tp), free(nt), free(lg), free(tl), free(tn);
        }

    /* 5. report */
    double gemm_tflops = gemm_us > 0 ? 2.0 * gm * (double)gn * gk / (gemm_us * 1e-6) / 1e12 : 0;
    FILE *jf = o.json ? stdout : NULL;
    if (o.json_file && !(jf = fopen(o.json_file, "w")))
        fprintf(stderr, "dsv4 bench: %s: cannot create: %s\n", o.json_file, strerror(errno));
    if (jf) {
        cJSON *rep = bench_json(&s, N, &o, gpu, t_gen, t_load, t_up, bw, gm, gn, gk, gemm_us, gemm_tflops, pf_t, pf_tflops,
                                pf_proj, pf_rows, res, nres);
        char *txt = rep ? cJSON_PrintUnformatted(rep) : NULL;
        if (txt) fprintf(jf, "%s\n", txt);
        else fprintf(stderr, "dsv4 bench: out of memory (the JSON report)\n");
        cJSON_free(txt);
        cJSON_Delete(rep);
        if (jf != stdout) fclose(jf);
    }
    if (!o.json) {
        printf("dsv4 bench: %s shapes, %d of %d layers (ratios", s.name, N, s.n_layers_full);
        for (int L = 0; L < N; L++) printf(" %d", s.ratio[L]);
        printf("), %s experts, seed %llu, device %s: %s\n", o.experts, o.seed, o.device, gpu);
        printf("checkpoint: %s (generated in %.1f s%s), load %.1f s, upload %.1f s\n", dir, t_gen,
               reuse ? ", reused" : "", t_load, t_up);
        printf("device-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 20)\n", bw);
        if (gemm_us > 0)
            printf("cuBLASLt FP8 GEMM %d x %d x %d (wq_b at the prompt length): %.1f us = %.1f TFLOP/s\n", gm, gn, gk,
                   gemm_us, gemm_tflops);
        if (o.prompt > 0) {
            printf("prefill %d tokens: %.1f ms = %.0f tokens/s, %.2f TFLOP/s (matrices + attention); "
                   "whole model (%d layers, %s): %.0f tokens/s",
                   o.prompt, pf_t * 1e3, o.prompt / pf_t, pf_tflops, s.n_layers_full, pf_how, o.prompt / pf_proj);
            if (pf_rows > 0) printf("; passes of up to %d rows\n", pf_rows);
            else printf("; one call\n");
        }
        printf("\ndecode (step / layers: %s; call: wall-clock median of %d dsv4_forward calls; bytes = the minimum a\n"
               "step reads; roofline = bytes / copy bandwidth)\n",
               nres && res[0].graph ? "median of the CUDA-graph replays" : "wall-clock median", o.steps);
        printf("%6s %7s | %9s %9s %8s %8s | %7s %8s %8s %8s %8s | %9s %6s | %10s %9s %9s %6s %8s\n", "batch", "context",
               "step ms", "layers ms", "head ms", "call ms", "experts", "dense MB", "exp MB", "head MB", "kv MB", "roof ms",
               "ratio", "full: ms", "GB", "roof ms", "ratio", "tok/s");
        for (int i = 0; i < nres; i++) {
            const dec_res *R = &res[i];
            printf("%6d %7d | %9.3f %9.3f %8.3f %8.3f | %7.1f %8.1f %8.1f %8.1f %8.2f | %9.4f %6.1f | %10.2f %9.2f %9.3f %6.1f "
                   "%8.1f\n",
                   R->batch, R->context, R->t_step * 1e3, R->t_layers * 1e3, R->t_head * 1e3, R->t_call * 1e3, R->uniq,
                   R->bytes_dense / 1e6, R->bytes_experts / 1e6, R->bytes_head / 1e6, R->bytes_kv / 1e6, R->roof * 1e3,
                   R->ratio, R->proj_step * 1e3, R->proj_bytes / 1e9, R->proj_roof * 1e3, R->proj_ratio,
                   R->batch / R->proj_step);
        }
        for (int i = 0; i < nres; i++) {
            const dec_res *R = &res[i];
            if (!R->ntypes) continue;
            printf("%s batch %d context %d, ms per layer:", i ? "" : "\nper layer type (the layers' replay time split as the op profile splits it):\n",
                   R->batch, R->context);
            for (int k = 0; k < R->ntypes; k++)
                if (R->type_ratio[k]) printf("  ratio %d: %.3f", R->type_ratio[k], R->t_type[k] * 1e3);
                else printf("  sliding window: %.3f", R->t_type[k] * 1e3);
            printf("\n");
        }
        printf("(experts: expected distinct routed experts per layer, E(1-(1-6/E)^B); kv in the reference's cache\n"
               " formats, the engine's caches (kv_cache.h: padded rows) read %.2fx that; full: %s + head ms)\n",
               nres && res[0].bytes_kv > 0 ? res[0].kv_engine / res[0].bytes_kv : 0,
               nres && res[0].ntypes ? "per-layer-type times x the whole model's layer counts" : "(layers ms / measured) x all layers");
    }
#ifdef DSV4_CUDA
    if (tf) {
        fclose(tf);
        if (g_traces)
            fprintf(stderr, "dsv4 bench: %d traces in %s (python3 bench/trace_report.py %s)\n", g_traces, o.trace, o.trace);
        else
            fprintf(stderr, "dsv4 bench: --trace: nothing was traced (decode steps without graphs?)\n");
    }
#endif
    dsv4_free(m);
    if (!o.keep && !o.dir) rm_dir(dir);
    return 0;
}
