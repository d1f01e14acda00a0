/* topk.c - see topk.h. The comparator is "greater by value"; the algorithm (libstdc++'s __introselect,
 * __heap_select, __adjust_heap ...) is in topk_algo.h, shared with the GPU's top-k. */
#include "topk.h"

#include <stdlib.h>

#define DSV4_TK_FN
#include "topk_algo.h"

void dsv4_topk_torch(const float *v, int n, int k, int *out) {
    if (k <= 0) return;
    tk_elem *q = malloc(sizeof(tk_elem) * (size_t)n);
    for (int i = 0; i < n; i++) q[i] = (tk_elem){v[i], i};
    tk_select_torch(q, n, k);
    for (int i = 0; i < k; i++) out[i] = q[i].i;
    free(q);
}
