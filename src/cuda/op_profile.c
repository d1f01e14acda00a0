/* op_profile.c - where a GPU forward's time goes, op by op (`dsv4 bench --profile`).
 *
 * While a profile is open (gprof_open), every op of forward_cuda.c that is not being captured into a graph
 * records a CUDA event after it is enqueued (gprof_mark, called by forward_cuda.c's CK); an op's time is
 * the distance from the event before it. Times are summed per (source line, layer type) over the runs of the
 * profile, split per layer type for `dsv4 bench`'s whole-model projection, and printed as a table: per run, the op's share and its calls. Events between the kernels keep
 * programmatic dependent launch from overlapping them and add a little time per op, so the sum is somewhat
 * above the graph replay's time; the ranking is what it is for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

typedef struct gmark {
    void *ev;
    const char *call;
    int line, ltype;
} gmark;

typedef struct gacc {
    const char *call;
    int line, ltype, calls;
    double ms;
} gacc;

struct gprof {
    gmark *mk;
    int nmk, capmk, nev; /* marks of the current run; events created so far (reused) */
    void **evs;
    gacc *acc;
    int nacc, capacc;
    int runs, ltype;
    int range; /* an external profiler's range is open */
};

static int acc_add(struct gprof *p, const gmark *m, double ms) {
    for (int i = 0; i < p->nacc; i++)
        if (p->acc[i].line == m->line && p->acc[i].ltype == m->ltype && p->acc[i].call == m->call) {
            p->acc[i].ms += ms, p->acc[i].calls++;
            return 0;
        }
    if (p->nacc == p->capacc) {
        int nc = p->capacc ? 2 * p->capacc : 256;
        gacc *a = realloc(p->acc, sizeof *a * (size_t)nc);
        if (!a) return -1;
        p->acc = a, p->capacc = nc;
    }
    p->acc[p->nacc++] = (gacc){m->call, m->line, m->ltype, 1, ms};
    return 0;
}

/* the run's marks into the sums (waits for its last event) */
static void flush(struct gprof *p) {
    for (int i = 1; i < p->nmk; i++) {
        double ms = dsv4_cuda_event_ms(p->mk[i - 1].ev, p->mk[i].ev);
        if (ms >= 0) acc_add(p, &p->mk[i], ms);
    }
    if (p->nmk > 1) p->runs++;
    p->nmk = 0;
}

int gprof_open(dsv4_cuda_model *g, const char *what) {
    if (g->prof) return 0;
    g->prof = calloc(1, sizeof *g->prof);
    if (!g->prof) return -1;
    const char *only = getenv("DSV4_PROFILER_RANGE");
    g->prof->range = !only || !*only || !strcmp(only, what);
    if (g->prof->range) dsv4_cuda_profiler_range(1);
    return 0;
}

void gprof_layer(dsv4_cuda_model *g, int ltype) {
    if (g->prof) g->prof->ltype = ltype;
}

void gprof_mark(dsv4_cuda_model *g, const char *call, int line) {
    struct gprof *p = g->prof;
    if (!p || g->capturing) return;
    if (p->nmk == p->capmk) {
        int nc = p->capmk ? 2 * p->capmk : 512;
        gmark *mk = realloc(p->mk, sizeof *mk * (size_t)nc);
        void **ev = realloc(p->evs, sizeof *ev * (size_t)nc);
        if (mk) p->mk = mk;
        if (ev) p->evs = ev;
        if (!mk || !ev) return;
        p->capmk = nc;
    }
    if (p->nmk == p->nev) {
        if (!(p->evs[p->nev] = dsv4_cuda_event_new())) return;
        p->nev++;
    }
    gmark *m = &p->mk[p->nmk];
    m->ev = p->evs[p->nmk];
    m->call = call, m->line = line, m->ltype = p->ltype;
    if (dsv4_cuda_event_record(m->ev, g->stream)) return;
    p->nmk++;
}

void gprof_run_begin(dsv4_cuda_model *g) {
    if (!g->prof) return;
    flush(g->prof);
    g->prof->ltype = -1;
    gprof_mark(g, "start", 0);
}

/* "lin(g, w, &gl->wq_a, x, T, w->qr)" -> "linear wq_a"; "dsv4_cuda_rmsnorm(w->qr, ..." -> "rmsnorm" */
static void label(const char *call, char *out, size_t cap) {
    if (!strncmp(call, "lin(", 4)) {
        const char *a = call + 4;
        for (int commas = 0; *a && commas < 2; a++) commas += *a == ',';
        while (*a == ' ' || *a == '&') a++;
        const char *arrow = strstr(a, "->");
        if (arrow && (!strchr(a, ',') || arrow < strchr(a, ','))) a = arrow + 2;
        size_t n = strcspn(a, ",)");
        snprintf(out, cap, "linear %.*s", (int)n, a);
        return;
    }
    if (!strncmp(call, "dsv4_cuda_", 10)) call += 10;
    size_t n = strcspn(call, "(");
    snprintf(out, cap, "%.*s", (int)n, call);
}

static int by_ms(const void *a, const void *b) {
    double x = ((const gacc *)a)->ms, y = ((const gacc *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* composite ops (their inner ops carry the time) */
static int composite(const char *call) {
    static const char *const names[] = {"sub_block(", "moe(", "attention(", "run_compressor(", "gpu_run_layers(",
                                        "gpu_run_head(", "ffn ?"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strncmp(call, names[i], strlen(names[i]))) return 1;
    return 0;
}

void gprof_close(dsv4_cuda_model *g, FILE *out, const char *title, dsv4_cuda_prof_split *sp) {
    struct gprof *p = g->prof;
    if (!p) return;
    flush(p);
    if (p->range) dsv4_cuda_profiler_range(0);
    const int runs = p->runs > 0 ? p->runs : 1;
    double total = 0;
    int kernels = 0;
    if (sp) memset(sp, 0, sizeof *sp);
    for (int i = 0; i < p->nacc; i++) {
        const gacc *a = &p->acc[i];
        if (composite(a->call)) continue;
        total += a->ms, kernels += a->calls;
        if (!sp) continue;
        if (a->ltype == -2) sp->head_ms += a->ms / runs;
        else if (a->ltype < 0) sp->other_ms += a->ms / runs;
        else {
            int k = 0;
            while (k < sp->n && sp->ratio[k] != a->ltype) k++;
            if (k == sp->n && k < DSV4_PROF_MAXTYPES) sp->ratio[sp->n++] = a->ltype;
            if (k < sp->n) sp->ms[k] += a->ms / runs;
        }
    }
    if (!out) goto done;
    qsort(p->acc, (size_t)p->nacc, sizeof *p->acc, by_ms);
    fprintf(out, "profile: %s: %d run(s); per run %.3f ms in %d ops (events after each op; PDL off)\n", title, p->runs,
            total / runs, kernels / runs);
    fprintf(out, "  %-28s %-6s %6s %10s %6s %7s\n", "op", "layers", "calls", "us/run", "share", "us/call");
    for (int i = 0; i < p->nacc; i++) {
        const gacc *a = &p->acc[i];
        if (composite(a->call) || a->ms <= 0) continue;
        char lb[64], lt[16];
        label(a->call, lb, sizeof lb);
        if (a->ltype == -2) snprintf(lt, sizeof lt, "head");
        else if (a->ltype < 0) snprintf(lt, sizeof lt, "-");
        else if (a->ltype == 0) snprintf(lt, sizeof lt, "swa");
        else snprintf(lt, sizeof lt, "c%d", a->ltype);
        fprintf(out, "  %-28s %-6s %6.1f %10.1f %5.1f%% %7.2f   (line %d)\n", lb, lt, (double)a->calls / runs,
                a->ms * 1e3 / runs, total > 0 ? 100 * a->ms / total : 0, a->ms * 1e3 / a->calls, a->line);
    }
done:
    for (int i = 0; i < p->nev; i++) dsv4_cuda_event_free(p->evs[i]);
    free(p->evs), free(p->mk), free(p->acc), free(p);
    g->prof = NULL;
}
