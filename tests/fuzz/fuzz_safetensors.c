/* fuzz_safetensors.c - libFuzzer target for dsv4_st_parse (the safetensors header validator).
 *
 * Any input must either parse into a set whose every tensor lies inside the input and is found by
 * name, or fail with a non-empty message naming the buffer. Anything else aborts (= a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsv4_st *st = NULL;
    dsv4_err err;
    err.msg[0] = 0;
    if (dsv4_st_parse(data, size, "fuzz.safetensors", &st, &err) != 0) {
        if (st || !err.msg[0] || !strstr(err.msg, "fuzz.safetensors")) abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < dsv4_st_count(st); i++) {
        const dsv4_st_tensor *t = dsv4_st_at(st, i);
        if (!t || dsv4_st_find(st, t->name) != t) abort();
        if (t->ndim < 0 || t->ndim > DSV4_ST_MAX_DIMS || t->numel < 0) abort();
        if (t->nbytes != (uint64_t)t->numel * dsv4_dtype_size(t->dtype)) abort();
        if (t->nbytes) {
            if (t->data < data || t->data + t->nbytes > data + size) abort();
            sink ^= t->data[0] ^ t->data[t->nbytes - 1]; /* ASan checks both ends */
        }
        total += t->nbytes;
    }
    if (total != dsv4_st_total_bytes(st) || dsv4_st_file_count(st) != 1) abort();
    (void)sink;
    dsv4_st_close(st);
    return 0;
}
