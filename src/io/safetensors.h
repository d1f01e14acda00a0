/* safetensors.h - memory-mapped safetensors checkpoints: one file, or shards with an index.
 *
 * Owns: parsing and checking the JSON header of every file (length against the file size, dtypes,
 * shapes, data offsets in range, no overlaps, byte counts = product(shape) * dtype size), the sharded
 * layout (model.safetensors.index.json + model-XXXXX-of-YYYYY.safetensors), lookup by name, and
 * writing a small F32/I32 safetensors file (for `dsv4 logits -o`). Tensor data stays in the mapping;
 * nothing is copied or converted here. */
#ifndef DSV4_IO_SAFETENSORS_H
#define DSV4_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../util/err.h"

typedef enum dsv4_dtype {
    DSV4_DT_F32,
    DSV4_DT_F16,
    DSV4_DT_BF16,
    DSV4_DT_F64,
    DSV4_DT_F8_E4M3, /* "F8_E4M3" */
    DSV4_DT_F8_E5M2, /* "F8_E5M2" */
    DSV4_DT_F8_E8M0, /* "F8_E8M0" (also accepted: "F8_E8M0FNU") */
    DSV4_DT_I8,
    DSV4_DT_U8,
    DSV4_DT_I16,
    DSV4_DT_U16,
    DSV4_DT_I32,
    DSV4_DT_U32,
    DSV4_DT_I64,
    DSV4_DT_U64,
    DSV4_DT_BOOL,
    DSV4_DT_COUNT
} dsv4_dtype;

const char *dsv4_dtype_name(dsv4_dtype t);  /* "F32", ... */
size_t dsv4_dtype_size(dsv4_dtype t);        /* bytes per element */
int dsv4_dtype_parse(const char *s, dsv4_dtype *out); /* 0 ok, -1 unknown */

#define DSV4_ST_MAX_DIMS 8

typedef struct dsv4_st_tensor {
    const char *name;       /* owned by the dsv4_st */
    dsv4_dtype dtype;
    int ndim;               /* 0 = scalar */
    int64_t shape[DSV4_ST_MAX_DIMS];
    int64_t numel;
    const uint8_t *data;    /* inside the mapping */
    uint64_t nbytes;
    int file;               /* index into the set's files */
} dsv4_st_tensor;

typedef struct dsv4_st dsv4_st; /* a set of mapped files */

/* Opens a model directory: model.safetensors.index.json + its shards if the index exists, else
 * model.safetensors, else every *.safetensors in the directory (sorted). Every file is mmapped
 * read-only and its header fully validated; a name appearing in two files is an error; an index
 * entry whose tensor is not in the named shard is an error. Errors name the file (and tensor). */
int dsv4_st_open_dir(const char *dir, dsv4_st **out, dsv4_err *err);
/* Opens a single file. */
int dsv4_st_open_file(const char *path, dsv4_st **out, dsv4_err *err);
void dsv4_st_close(dsv4_st *st);

size_t dsv4_st_count(const dsv4_st *st);
const dsv4_st_tensor *dsv4_st_at(const dsv4_st *st, size_t i);     /* stable order: by file, then offset */
const dsv4_st_tensor *dsv4_st_find(const dsv4_st *st, const char *name); /* NULL if absent (hashed) */
const char *dsv4_st_file_path(const dsv4_st *st, int file);
int dsv4_st_file_count(const dsv4_st *st);
uint64_t dsv4_st_total_bytes(const dsv4_st *st); /* sum of tensor bytes */

/* Validates a safetensors image held in memory (the whole file: 8-byte length, header, data) and
 * returns its tensors as a set backed by `buf` (not copied; buf must outlive the set). Used by the
 * file loader and by the fuzzer. `what` names the buffer in errors (a path). */
int dsv4_st_parse(const uint8_t *buf, size_t len, const char *what, dsv4_st **out, dsv4_err *err);

/* Writes a safetensors file holding the given tensors (data pointed to by .data, nbytes exact).
 * Header keys sorted, data 8-byte aligned. */
int dsv4_st_write(const char *path, const dsv4_st_tensor *tensors, size_t n, dsv4_err *err);

#endif
