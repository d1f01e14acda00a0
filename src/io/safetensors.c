/* safetensors.c - see safetensors.h.
 *
 * Layout of a safetensors file: u64 little-endian N, N bytes of JSON header (an object mapping tensor
 * names to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" string map),
 * then the data section; offsets are relative to the start of the data section.
 *
 * Every check is done before any pointer into the data section is formed, with 64-bit arithmetic that
 * cannot overflow (explicit bounds or __builtin_*_overflow). */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/json.h"
#include "../util/strbuf.h"

/* Header larger than this is "absurd" (the reference implementation uses the same 100 MB bound). */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Largest integer a JSON number (a double) represents exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0 /* 2^53 */
/* Index files are small; anything past this is refused. */
#define ST_MAX_INDEX_BYTES ((size_t)256 << 20)

/* ------------------------------------------------------------------------------------------------ */
/* dtypes */

static const struct {
    const char *name;
    size_t size;
} dtype_info[DSV4_DT_COUNT] = {
    [DSV4_DT_F32] = {"F32", 4},         [DSV4_DT_F16] = {"F16", 2},
    [DSV4_DT_BF16] = {"BF16", 2},       [DSV4_DT_F64] = {"F64", 8},
    [DSV4_DT_F8_E4M3] = {"F8_E4M3", 1}, [DSV4_DT_F8_E5M2] = {"F8_E5M2", 1},
    [DSV4_DT_F8_E8M0] = {"F8_E8M0", 1}, [DSV4_DT_I8] = {"I8", 1},
    [DSV4_DT_U8] = {"U8", 1},           [DSV4_DT_I16] = {"I16", 2},
    [DSV4_DT_U16] = {"U16", 2},         [DSV4_DT_I32] = {"I32", 4},
    [DSV4_DT_U32] = {"U32", 4},         [DSV4_DT_I64] = {"I64", 8},
    [DSV4_DT_U64] = {"U64", 8},         [DSV4_DT_BOOL] = {"BOOL", 1},
};

const char *dsv4_dtype_name(dsv4_dtype t) {
    if ((unsigned)t >= DSV4_DT_COUNT) return "?";
    return dtype_info[t].name;
}

size_t dsv4_dtype_size(dsv4_dtype t) {
    if ((unsigned)t >= DSV4_DT_COUNT) return 0;
    return dtype_info[t].size;
}

int dsv4_dtype_parse(const char *s, dsv4_dtype *out) {
    if (!s) return -1;
    for (int i = 0; i < DSV4_DT_COUNT; i++) {
        if (strcmp(s, dtype_info[i].name) == 0) {
            if (out) *out = (dsv4_dtype)i;
            return 0;
        }
    }
    if (strcmp(s, "F8_E8M0FNU") == 0) {
        if (out) *out = DSV4_DT_F8_E8M0;
        return 0;
    }
    return -1;
}

/* ------------------------------------------------------------------------------------------------ */
/* the set */

typedef struct st_file {
    char *path;
    const uint8_t *base; /* whole file */
    size_t len;
    int mapped;          /* 1: munmap on close; 0: caller's buffer */
} st_file;

struct dsv4_st {
    st_file *files;
    int n_files, cap_files;
    dsv4_st_tensor *t;
    size_t n, cap;
    uint32_t *slots; /* open addressing: tensor index + 1, 0 = empty */
    size_t n_slots;  /* power of two */
    uint64_t total_bytes;
};

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

/* Returns the slot holding `name`, or the empty slot where it would go. */
static size_t slot_of(const dsv4_st *st, const char *name) {
    size_t mask = st->n_slots - 1, i = (size_t)hash_name(name) & mask;
    while (st->slots[i] && strcmp(st->t[st->slots[i] - 1].name, name) != 0) i = (i + 1) & mask;
    return i;
}

static int hash_grow(dsv4_st *st, size_t want) {
    size_t ns = st->n_slots ? st->n_slots : 64;
    while (ns < want * 2) {
        if (ns > SIZE_MAX / 4) return -1;
        ns *= 2;
    }
    if (ns == st->n_slots) return 0;
    uint32_t *old = st->slots;
    size_t old_n = st->n_slots;
    st->slots = calloc(ns, sizeof *st->slots);
    if (!st->slots) {
        st->slots = old;
        return -1;
    }
    st->n_slots = ns;
    for (size_t i = 0; i < old_n; i++)
        if (old[i]) st->slots[slot_of(st, st->t[old[i] - 1].name)] = old[i];
    free(old);
    return 0;
}

static dsv4_st *st_new(void) { return calloc(1, sizeof(dsv4_st)); }

void dsv4_st_close(dsv4_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].mapped && st->files[i].base) munmap((void *)st->files[i].base, st->files[i].len);
        free(st->files[i].path);
    }
    for (size_t i = 0; i < st->n; i++) free((char *)st->t[i].name);
    free(st->files);
    free(st->t);
    free(st->slots);
    free(st);
}

size_t dsv4_st_count(const dsv4_st *st) { return st ? st->n : 0; }

const dsv4_st_tensor *dsv4_st_at(const dsv4_st *st, size_t i) {
    return st && i < st->n ? &st->t[i] : NULL;
}

const dsv4_st_tensor *dsv4_st_find(const dsv4_st *st, const char *name) {
    if (!st || !name || !st->n_slots) return NULL;
    uint32_t s = st->slots[slot_of(st, name)];
    return s ? &st->t[s - 1] : NULL;
}

const char *dsv4_st_file_path(const dsv4_st *st, int file) {
    return st && file >= 0 && file < st->n_files ? st->files[file].path : NULL;
}

int dsv4_st_file_count(const dsv4_st *st) { return st ? st->n_files : 0; }

uint64_t dsv4_st_total_bytes(const dsv4_st *st) { return st ? st->total_bytes : 0; }

/* Adds a file record (takes nothing: copies path). Returns its index or -1. */
static int add_file(dsv4_st *st, const char *path, const uint8_t *base, size_t len, int mapped) {
    if (st->n_files == st->cap_files) {
        int nc = st->cap_files ? st->cap_files * 2 : 4;
        st_file *nf = realloc(st->files, (size_t)nc * sizeof *nf);
        if (!nf) return -1;
        st->files = nf;
        st->cap_files = nc;
    }
    char *p = strdup(path ? path : "(buffer)");
    if (!p) return -1;
    st->files[st->n_files] = (st_file){p, base, len, mapped};
    return st->n_files++;
}

/* ------------------------------------------------------------------------------------------------ */
/* header parsing */

/* A JSON number that is an integer in [0, 2^53]. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double v = j->valuedouble;
    if (!isfinite(v) || v < 0 || v > ST_MAX_JSON_INT || floor(v) != v) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int cmp_offset(const void *a, const void *b) {
    const dsv4_st_tensor *x = a, *y = b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Parses one tensor entry of file `what` into *t (name not set). */
static int parse_entry(const cJSON *e, const char *what, const char *name, const uint8_t *data,
                       uint64_t data_len, dsv4_st_tensor *t, dsv4_err *err) {
    if (!cJSON_IsObject(e))
        return dsv4_errf(err, "%s: tensor '%s': entry must be an object (got %s)", what, name, dsv4_json_kind(e));
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return dsv4_errf(err, "%s: tensor '%s': 'dtype' must be a string (got %s)", what, name, dsv4_json_kind(dt));
    if (dsv4_dtype_parse(dt->valuestring, &t->dtype) != 0)
        return dsv4_errf(err, "%s: tensor '%s': unknown dtype '%.64s'", what, name, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return dsv4_errf(err, "%s: tensor '%s': 'shape' must be an array (got %s)", what, name, dsv4_json_kind(sh));
    if (!cJSON_IsArray(of))
        return dsv4_errf(err, "%s: tensor '%s': 'data_offsets' must be an array (got %s)", what, name,
                         dsv4_json_kind(of));

    int nd = 0;
    uint64_t numel = 1;
    int overflow = 0;
    for (const cJSON *d = sh->child; d; d = d->next) {
        if (nd >= DSV4_ST_MAX_DIMS)
            return dsv4_errf(err, "%s: tensor '%s': more than %d dimensions", what, name, DSV4_ST_MAX_DIMS);
        uint64_t v;
        if (json_uint(d, &v) != 0) {
            if (cJSON_IsNumber(d) && d->valuedouble < 0)
                return dsv4_errf(err, "%s: tensor '%s': negative dimension %d (%g)", what, name, nd,
                                 d->valuedouble);
            if (cJSON_IsNumber(d))
                return dsv4_errf(err, "%s: tensor '%s': dimension %d is not an integer in [0, 2^53] (%g)", what,
                                 name, nd, d->valuedouble);
            return dsv4_errf(err, "%s: tensor '%s': dimension %d must be an integer (got %s)", what, name, nd,
                             dsv4_json_kind(d));
        }
        t->shape[nd++] = (int64_t)v;
        if (!overflow && __builtin_mul_overflow(numel, v, &numel)) overflow = 1;
    }
    t->ndim = nd;
    /* A zero dimension makes the product 0 whatever the others are; only a non-zero overflow is fatal. */
    for (int i = 0; i < nd; i++)
        if (t->shape[i] == 0) {
            numel = 0;
            overflow = 0;
        }
    uint64_t esz = dsv4_dtype_size(t->dtype), want = 0;
    if (overflow || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, esz, &want))
        return dsv4_errf(err, "%s: tensor '%s': shape product overflows", what, name);
    t->numel = (int64_t)numel;

    const cJSON *b = of->child, *en = b ? b->next : NULL;
    uint64_t begin, end;
    if (!b || !en || en->next || json_uint(b, &begin) != 0 || json_uint(en, &end) != 0)
        return dsv4_errf(err, "%s: tensor '%s': 'data_offsets' must be two non-negative integers", what, name);
    if (end < begin)
        return dsv4_errf(err, "%s: tensor '%s': data_offsets [%llu, %llu] not ascending", what, name,
                         (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return dsv4_errf(err, "%s: tensor '%s': data_offsets [%llu, %llu] past the end of the data section (%llu bytes)",
                         what, name, (unsigned long long)begin, (unsigned long long)end,
                         (unsigned long long)data_len);
    if (end - begin != want)
        return dsv4_errf(err, "%s: tensor '%s': byte length %llu != %llu elements * %zu bytes (%s)", what, name,
                         (unsigned long long)(end - begin), (unsigned long long)numel, (size_t)esz,
                         dsv4_dtype_name(t->dtype));
    t->data = data + begin;
    t->nbytes = want;
    return 0;
}

/* Validates the image buf[0..len) and appends its tensors to st as file `fi`. On failure st may hold
 * a partial set of this file's tensors (the caller frees the whole set). */
static int parse_into(dsv4_st *st, int fi, const uint8_t *buf, size_t len, const char *what, dsv4_err *err) {
    if (!buf && len) return dsv4_errf(err, "%s: no data", what);
    if (len < 8) return dsv4_errf(err, "%s: file too short (%zu bytes; a safetensors file has at least 8)", what, len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
    if (hl > (uint64_t)(len - 8))
        return dsv4_errf(err, "%s: header length %llu past the end of the file (%zu bytes)", what,
                         (unsigned long long)hl, len);
    if (hl > ST_MAX_HEADER)
        return dsv4_errf(err, "%s: header length %llu is absurd (limit %llu)", what, (unsigned long long)hl,
                         (unsigned long long)ST_MAX_HEADER);
    if (hl < 2) return dsv4_errf(err, "%s: header length %llu too small for a JSON object", what, (unsigned long long)hl);
    const char *hdr = (const char *)buf + 8;
    if (memchr(hdr, 0, (size_t)hl)) return dsv4_errf(err, "%s: header contains a NUL byte", what);
    if (hdr[0] != '{') return dsv4_errf(err, "%s: header is not a JSON object", what);

    /* cJSON gets a NUL-terminated copy, so that no parser slip can read past the header. */
    char *copy = malloc((size_t)hl + 1);
    if (!copy) return dsv4_errf(err, "%s: out of memory for a %llu-byte header", what, (unsigned long long)hl);
    memcpy(copy, hdr, (size_t)hl);
    copy[hl] = 0;
    hdr = copy;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hl, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hl ? (size_t)(end - hdr) : 0;
        free(copy);
        return dsv4_errf(err, "%s: header is not valid JSON (near byte %zu of %llu)", what, at, (unsigned long long)hl);
    }
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        dsv4_errf(err, "%s: header is not a JSON object", what);
        goto out;
    }
    for (const char *p = end; p && p < hdr + hl; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            dsv4_errf(err, "%s: trailing bytes after the JSON header (at byte %zu)", what, (size_t)(p - hdr));
            goto out;
        }
    }

    const uint8_t *data = buf + 8 + hl;
    uint64_t data_len = (uint64_t)(len - 8) - hl;
    size_t base = st->n;
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (!name) {
            dsv4_errf(err, "%s: header entry without a name", what);
            goto out;
        }
        if (strcmp(name, "__metadata__") == 0) {
            if (!cJSON_IsObject(e) && !cJSON_IsNull(e)) {
                dsv4_errf(err, "%s: '__metadata__' must be an object of strings (got %s)", what, dsv4_json_kind(e));
                goto out;
            }
            for (const cJSON *m = e->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    dsv4_errf(err, "%s: '__metadata__' entry '%s' must be a string (got %s)", what,
                              m->string ? m->string : "?", dsv4_json_kind(m));
                    goto out;
                }
            continue;
        }
        if (st->n == st->cap) {
            size_t nc = st->cap ? st->cap * 2 : 64;
            if (nc > UINT32_MAX - 1) {
                dsv4_errf(err, "%s: too many tensors", what);
                goto out;
            }
            dsv4_st_tensor *nt = realloc(st->t, nc * sizeof *nt);
            if (!nt) {
                dsv4_errf(err, "%s: out of memory", what);
                goto out;
            }
            st->t = nt;
            st->cap = nc;
        }
        dsv4_st_tensor *t = &st->t[st->n];
        memset(t, 0, sizeof *t);
        if (parse_entry(e, what, name, data, data_len, t, err) != 0) goto out;
        t->name = strdup(name);
        if (!t->name) {
            dsv4_errf(err, "%s: out of memory", what);
            goto out;
        }
        t->file = fi;
        st->n++;
    }

    /* Stable order within the file: by offset. */
    size_t cnt = st->n - base;
    if (cnt > 1) qsort(st->t + base, cnt, sizeof *st->t, cmp_offset);

    /* Names: unique within the file and across the set. */
    if (hash_grow(st, st->n) != 0) {
        dsv4_errf(err, "%s: out of memory", what);
        goto out;
    }
    for (size_t i = base; i < st->n; i++) {
        size_t s = slot_of(st, st->t[i].name);
        if (st->slots[s]) {
            const dsv4_st_tensor *o = &st->t[st->slots[s] - 1];
            if (o->file == fi)
                dsv4_errf(err, "%s: tensor '%s': duplicate name in the header", what, st->t[i].name);
            else
                dsv4_errf(err, "%s: tensor '%s': also present in %s", what, st->t[i].name, st->files[o->file].path);
            goto out;
        }
        st->slots[s] = (uint32_t)(i + 1);
    }

    /* No two tensors share a byte (empty tensors occupy none). */
    const dsv4_st_tensor *prev = NULL;
    for (size_t i = base; i < st->n; i++) {
        const dsv4_st_tensor *t = &st->t[i];
        if (!t->nbytes) continue;
        if (prev && t->data < prev->data + prev->nbytes) {
            dsv4_errf(err, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", what, prev->name,
                      (unsigned long long)(prev->data - data), (unsigned long long)(prev->data - data + prev->nbytes),
                      t->name, (unsigned long long)(t->data - data), (unsigned long long)(t->data - data + t->nbytes));
            goto out;
        }
        prev = t;
    }
    for (size_t i = base; i < st->n; i++) st->total_bytes += st->t[i].nbytes;
    rc = 0;
out:
    cJSON_Delete(root);
    free(copy);
    return rc;
}

int dsv4_st_parse(const uint8_t *buf, size_t len, const char *what, dsv4_st **out, dsv4_err *err) {
    if (!out) return dsv4_errf(err, "dsv4_st_parse: no output");
    *out = NULL;
    if (!what) what = "(buffer)";
    dsv4_st *st = st_new();
    if (!st) return dsv4_errf(err, "%s: out of memory", what);
    int fi = add_file(st, what, buf, len, 0);
    if (fi < 0) {
        dsv4_st_close(st);
        return dsv4_errf(err, "%s: out of memory", what);
    }
    if (parse_into(st, fi, buf, len, what, err) != 0) {
        dsv4_st_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* files */

/* mmaps `path` read-only and appends it to st. */
static int map_into(dsv4_st *st, const char *path, dsv4_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dsv4_errf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dsv4_errf(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return dsv4_errf(err, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return dsv4_errf(err, "%s: file too short (%lld bytes; a safetensors file has at least 8)", path,
                         (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return dsv4_errf(err, "%s: file too large to map", path);
    }
    size_t len = (size_t)sb.st_size;
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return dsv4_errf(err, "%s: mmap failed: %s", path, strerror(e));
    int fi = add_file(st, path, m, len, 1);
    if (fi < 0) {
        munmap(m, len);
        return dsv4_errf(err, "%s: out of memory", path);
    }
    return parse_into(st, fi, m, len, path, err);
}

int dsv4_st_open_file(const char *path, dsv4_st **out, dsv4_err *err) {
    if (!out) return dsv4_errf(err, "dsv4_st_open_file: no output");
    *out = NULL;
    if (!path) return dsv4_errf(err, "dsv4_st_open_file: no path");
    dsv4_st *st = st_new();
    if (!st) return dsv4_errf(err, "%s: out of memory", path);
    if (map_into(st, path, err) != 0) {
        dsv4_st_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int safe_shard_name(const char *s) {
    if (!*s || s[0] == '/') return 0;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
        p += n;
        if (*p == '/') p++;
    }
    return 1;
}

static int open_indexed(const char *dir, const char *index_path, dsv4_st **out, dsv4_err *err) {
    size_t tlen = 0;
    char *text = dsv4_read_file(index_path, ST_MAX_INDEX_BYTES, &tlen, err);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, tlen);
    free(text);
    if (!root) return dsv4_errf(err, "%s: not valid JSON", index_path);
    int rc = -1;
    dsv4_st *st = NULL;
    char **names = NULL;
    size_t n_names = 0;
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(root)) {
        dsv4_errf(err, "%s: not a JSON object", index_path);
        goto out;
    }
    if (!cJSON_IsObject(wm)) {
        dsv4_errf(err, "%s: 'weight_map' must be an object (got %s)", index_path, dsv4_json_kind(wm));
        goto out;
    }
    size_t n_entries = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring) {
            dsv4_errf(err, "%s: weight_map entry '%s' must be a file name (got %s)", index_path,
                      e->string ? e->string : "?", dsv4_json_kind(e));
            goto out;
        }
        if (!safe_shard_name(e->valuestring)) {
            dsv4_errf(err, "%s: weight_map entry '%s': bad shard file name '%s'", index_path,
                      e->string ? e->string : "?", e->valuestring);
            goto out;
        }
        n_entries++;
    }
    if (n_entries == 0) {
        dsv4_errf(err, "%s: 'weight_map' is empty", index_path);
        goto out;
    }
    names = malloc(n_entries * sizeof *names);
    if (!names) {
        dsv4_errf(err, "%s: out of memory", index_path);
        goto out;
    }
    for (const cJSON *e = wm->child; e; e = e->next) names[n_names++] = e->valuestring;
    qsort(names, n_names, sizeof *names, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n_names; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    n_names = u;

    st = st_new();
    if (!st) {
        dsv4_errf(err, "%s: out of memory", index_path);
        goto out;
    }
    for (size_t i = 0; i < n_names; i++) {
        char *p = join_path(dir, names[i]);
        if (!p) {
            dsv4_errf(err, "%s: out of memory", index_path);
            goto out;
        }
        struct stat sb;
        if (stat(p, &sb) != 0) {
            dsv4_errf(err, "%s: shard file '%s' named by the index is missing (%s)", index_path, p, strerror(errno));
            free(p);
            goto out;
        }
        int r = map_into(st, p, err);
        free(p);
        if (r != 0) goto out;
    }
    size_t prefix = strlen(dir);
    if (prefix && dir[prefix - 1] != '/') prefix++;
    for (const cJSON *e = wm->child; e; e = e->next) {
        const dsv4_st_tensor *t = dsv4_st_find(st, e->string);
        const char *want = e->valuestring;
        const char *fp = t ? st->files[t->file].path : NULL;
        /* files[].path = join_path(dir, shard name) */
        int same = fp && strlen(fp) >= prefix && strcmp(fp + prefix, want) == 0;
        if (!t) {
            char *p = join_path(dir, want);
            dsv4_errf(err, "%s: tensor '%s' is not in its shard %s", index_path, e->string, p ? p : want);
            free(p);
            goto out;
        }
        if (!same) {
            dsv4_errf(err, "%s: tensor '%s' is listed in %s but found in %s", index_path, e->string, want, fp);
            goto out;
        }
    }
    rc = 0;
out:
    free(names);
    cJSON_Delete(root);
    if (rc == 0)
        *out = st;
    else
        dsv4_st_close(st);
    return rc;
}

int dsv4_st_open_dir(const char *dir, dsv4_st **out, dsv4_err *err) {
    if (!out) return dsv4_errf(err, "dsv4_st_open_dir: no output");
    *out = NULL;
    if (!dir) return dsv4_errf(err, "dsv4_st_open_dir: no path");
    struct stat sb;
    if (stat(dir, &sb) != 0) return dsv4_errf(err, "%s: %s", dir, strerror(errno));
    if (S_ISREG(sb.st_mode)) return dsv4_st_open_file(dir, out, err);
    if (!S_ISDIR(sb.st_mode)) return dsv4_errf(err, "%s: not a directory", dir);

    char *p = join_path(dir, "model.safetensors.index.json");
    if (!p) return dsv4_errf(err, "%s: out of memory", dir);
    if (stat(p, &sb) == 0) {
        int r = open_indexed(dir, p, out, err);
        free(p);
        return r;
    }
    free(p);
    p = join_path(dir, "model.safetensors");
    if (!p) return dsv4_errf(err, "%s: out of memory", dir);
    if (stat(p, &sb) == 0) {
        int r = dsv4_st_open_file(p, out, err);
        free(p);
        return r;
    }
    free(p);

    DIR *d = opendir(dir);
    if (!d) return dsv4_errf(err, "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = -1;
    dsv4_st *st = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors") != 0) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char **nn = realloc(names, nc * sizeof *nn);
            if (!nn) goto oom;
            names = nn;
            cap = nc;
        }
        if (!(names[n] = strdup(de->d_name))) goto oom;
        n++;
    }
    closedir(d);
    d = NULL;
    if (n == 0) {
        dsv4_errf(err, "%s: no model.safetensors.index.json, model.safetensors or *.safetensors", dir);
        goto out;
    }
    qsort(names, n, sizeof *names, cmp_str);
    if (!(st = st_new())) goto oom;
    for (size_t i = 0; i < n; i++) {
        char *fp = join_path(dir, names[i]);
        if (!fp) goto oom;
        int r = map_into(st, fp, err);
        free(fp);
        if (r != 0) goto out;
    }
    rc = 0;
    goto out;
oom:
    dsv4_errf(err, "%s: out of memory", dir);
out:
    if (d) closedir(d);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc == 0)
        *out = st;
    else
        dsv4_st_close(st);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* writing */

static void sb_json_string(dsv4_sb *b, const char *s) {
    dsv4_sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        if (*p == '"' || *p == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)*p;
            dsv4_sb_put(b, tmp, 2);
        } else if (*p < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", *p);
            dsv4_sb_put(b, tmp, 6);
        } else {
            dsv4_sb_put(b, (const char *)p, 1);
        }
    }
    dsv4_sb_put(b, "\"", 1);
}

typedef struct {
    const dsv4_st_tensor *t;
    uint64_t off;
} wslot;

static int cmp_wname(const void *a, const void *b) {
    return strcmp(((const wslot *)a)->t->name, ((const wslot *)b)->t->name);
}

/* Data order: larger elements first (every tensor stays aligned to its element size), then by name. */
static int cmp_wlayout(const void *a, const void *b) {
    const dsv4_st_tensor *x = *(const dsv4_st_tensor *const *)a, *y = *(const dsv4_st_tensor *const *)b;
    size_t sx = dsv4_dtype_size(x->dtype), sy = dsv4_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

int dsv4_st_write(const char *path, const dsv4_st_tensor *tensors, size_t n, dsv4_err *err) {
    if (!path) return dsv4_errf(err, "dsv4_st_write: no path");
    if (n && !tensors) return dsv4_errf(err, "%s: no tensors given", path);
    for (size_t i = 0; i < n; i++) {
        const dsv4_st_tensor *t = &tensors[i];
        if (!t->name || !*t->name) return dsv4_errf(err, "%s: tensor %zu has no name", path, i);
        if (strcmp(t->name, "__metadata__") == 0) return dsv4_errf(err, "%s: tensor name '__metadata__' is reserved", path);
        if ((unsigned)t->dtype >= DSV4_DT_COUNT) return dsv4_errf(err, "%s: tensor '%s': bad dtype %d", path, t->name, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > DSV4_ST_MAX_DIMS)
            return dsv4_errf(err, "%s: tensor '%s': bad ndim %d", path, t->name, t->ndim);
        uint64_t numel = 1, bytes;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) return dsv4_errf(err, "%s: tensor '%s': negative dimension", path, t->name);
            if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
                return dsv4_errf(err, "%s: tensor '%s': shape product overflows", path, t->name);
        }
        if (__builtin_mul_overflow(numel, (uint64_t)dsv4_dtype_size(t->dtype), &bytes) || bytes != t->nbytes)
            return dsv4_errf(err, "%s: tensor '%s': nbytes %llu != product(shape) * %zu", path, t->name,
                             (unsigned long long)t->nbytes, dsv4_dtype_size(t->dtype));
        if (bytes && !t->data) return dsv4_errf(err, "%s: tensor '%s': no data", path, t->name);
    }

    int rc = -1;
    FILE *f = NULL;
    char *tmp = NULL;
    dsv4_sb h = {0};
    const dsv4_st_tensor **lay = malloc((n ? n : 1) * sizeof *lay);
    wslot *ws = malloc((n ? n : 1) * sizeof *ws);
    if (!lay || !ws) {
        dsv4_errf(err, "%s: out of memory", path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) lay[i] = &tensors[i];
    qsort(lay, n, sizeof *lay, cmp_wlayout);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        ws[i] = (wslot){lay[i], off};
        off += lay[i]->nbytes;
    }
    qsort(ws, n, sizeof *ws, cmp_wname);
    for (size_t i = 1; i < n; i++)
        if (strcmp(ws[i].t->name, ws[i - 1].t->name) == 0) {
            dsv4_errf(err, "%s: tensor '%s': duplicate name", path, ws[i].t->name);
            goto out;
        }

    dsv4_sb_puts(&h, "{");
    for (size_t i = 0; i < n; i++) {
        const dsv4_st_tensor *t = ws[i].t;
        if (i) dsv4_sb_puts(&h, ",");
        sb_json_string(&h, t->name);
        dsv4_sb_puts(&h, ":{\"dtype\":\"");
        dsv4_sb_puts(&h, dsv4_dtype_name(t->dtype));
        dsv4_sb_puts(&h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) dsv4_sb_puts(&h, ",");
            dsv4_sb_printf(&h, "%llu", (unsigned long long)t->shape[d]);
        }
        dsv4_sb_puts(&h, "],\"data_offsets\":[");
        dsv4_sb_printf(&h, "%llu", (unsigned long long)ws[i].off);
        dsv4_sb_puts(&h, ",");
        dsv4_sb_printf(&h, "%llu", (unsigned long long)(ws[i].off + t->nbytes));
        dsv4_sb_puts(&h, "]}");
    }
    dsv4_sb_puts(&h, "}");
    while (!h.oom && h.n % 8) dsv4_sb_putc(&h, ' '); /* header padded to 8 bytes */
    if (h.oom) {
        dsv4_errf(err, "%s: out of memory", path);
        goto out;
    }

    size_t pl = strlen(path);
    tmp = malloc(pl + 16);
    if (!tmp) {
        dsv4_errf(err, "%s: out of memory", path);
        goto out;
    }
    snprintf(tmp, pl + 16, "%s.tmp%ld", path, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f) {
        dsv4_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    int bad = fwrite(le, 1, 8, f) != 8 || fwrite(h.p, 1, h.n, f) != h.n;
    for (size_t i = 0; i < n && !bad; i++)
        if (lay[i]->nbytes && fwrite(lay[i]->data, 1, lay[i]->nbytes, f) != lay[i]->nbytes) bad = 1;
    if (fclose(f) != 0) bad = 1;
    f = NULL;
    if (bad) {
        dsv4_errf(err, "%s: write failed: %s", tmp, strerror(errno));
        remove(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0) {
        dsv4_errf(err, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
        remove(tmp);
        goto out;
    }
    rc = 0;
out:
    if (f) fclose(f);
    free(tmp);
    dsv4_sb_free(&h);
    free(lay);
    free(ws);
    return rc;
}
