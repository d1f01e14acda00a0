/* trace.h - the GPU's timeline of the kernels between a begin and an end (trace.cu: CUPTI's activity records, libcupti
 * opened at run time), plain C, for `dsv4 bench --trace FILE`. */
#ifndef DSV4_CUDA_TRACE_H
#define DSV4_CUDA_TRACE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Starts recording every kernel the process runs on the GPU. 0, or -1 with err (no libcupti, a trace running). */
int dsv4_cuda_trace_begin(char *err, size_t errcap);
/* Waits for the records, stops, and appends "# title" and a line a kernel in start order to f (trace.cu says which
 * fields). 0, or -1 with err (nothing recorded, out of memory, a write error). */
int dsv4_cuda_trace_end(FILE *f, const char *title, char *err, size_t errcap);

#ifdef __cplusplus
}
#endif
#endif
