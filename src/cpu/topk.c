/* topk.c - see topk.h. The comparator is "greater by value"; the helpers follow libstdc++'s
 * bits/stl_heap.h and bits/stl_algo.h (__introselect, __heap_select, __adjust_heap ...). */
#include "topk.h"

#include <stdlib.h>

typedef struct {
    float v;
    int i;
} elem;

static int gt(elem a, elem b) { return a.v > b.v; }

static void push_heap(elem *f, long hole, long top, elem val) {
    long parent = (hole - 1) / 2;
    while (hole > top && gt(f[parent], val)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = val;
}

static void adjust_heap(elem *f, long hole, long len, elem val) {
    long top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (gt(f[child], f[child - 1])) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    push_heap(f, hole, top, val);
}

static void make_heap(elem *f, long len) {
    if (len < 2) return;
    for (long parent = (len - 2) / 2;; parent--) {
        adjust_heap(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}

static void heap_select(elem *f, long mid, long last) {
    make_heap(f, mid);
    for (long i = mid; i < last; i++)
        if (gt(f[i], f[0])) {
            elem val = f[i];
            f[i] = f[0];
            adjust_heap(f, 0, mid, val);
        }
}

static void swap(elem *a, elem *b) {
    elem t = *a;
    *a = *b;
    *b = t;
}

static void move_median_to_first(elem *r, elem *a, elem *b, elem *c) {
    if (gt(*a, *b)) {
        if (gt(*b, *c)) swap(r, b);
        else if (gt(*a, *c)) swap(r, c);
        else swap(r, a);
    } else if (gt(*a, *c)) swap(r, a);
    else if (gt(*b, *c)) swap(r, c);
    else swap(r, b);
}

static elem *unguarded_partition(elem *first, elem *last, elem *pivot) {
    for (;;) {
        while (gt(*first, *pivot)) first++;
        last--;
        while (gt(*pivot, *last)) last--;
        if (!(first < last)) return first;
        swap(first, last);
        first++;
    }
}

static void insertion_sort(elem *first, elem *last) {
    if (first == last) return;
    for (elem *i = first + 1; i != last; i++) {
        elem val = *i;
        if (gt(val, *first)) {
            for (elem *j = i; j != first; j--) j[0] = j[-1];
            *first = val;
        } else {
            elem *j = i;
            while (gt(val, j[-1])) {
                j[0] = j[-1];
                j--;
            }
            *j = val;
        }
    }
}

static int lg(long n) {
    int r = 0;
    while (n >>= 1) r++;
    return r;
}

static void nth_element(elem *first, elem *nth, elem *last) {
    if (first == last || nth == last) return;
    int depth = 2 * lg(last - first);
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth - first + 1, last - first);
            swap(first, nth);
            return;
        }
        depth--;
        elem *mid = first + (last - first) / 2;
        move_median_to_first(first, first + 1, mid, last - 1);
        elem *cut = unguarded_partition(first + 1, last, first);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    insertion_sort(first, last);
}

/* std::__sort_heap: pops the heap [f, f+len) into comparator order (here: decreasing). */
static void sort_heap(elem *f, long len) {
    while (len > 1) {
        len--;
        elem val = f[len];
        f[len] = f[0];
        adjust_heap(f, 0, len, val);
    }
}

static void introsort_loop(elem *first, elem *last, int depth) {
    while (last - first > 16) {
        if (depth == 0) { /* std::__partial_sort(first, last, last) */
            heap_select(first, last - first, last - first);
            sort_heap(first, last - first);
            return;
        }
        depth--;
        elem *mid = first + (last - first) / 2;
        move_median_to_first(first, first + 1, mid, last - 1);
        elem *cut = unguarded_partition(first + 1, last, first);
        introsort_loop(cut, last, depth);
        last = cut;
    }
}

static void unguarded_linear_insert(elem *i) {
    elem val = *i;
    while (gt(val, i[-1])) {
        i[0] = i[-1];
        i--;
    }
    *i = val;
}

/* std::sort: introsort, then the final insertion sort (guarded over the first 16). */
static void sort(elem *first, elem *last) {
    if (first == last) return;
    introsort_loop(first, last, 2 * lg(last - first));
    if (last - first > 16) {
        insertion_sort(first, first + 16);
        for (elem *i = first + 16; i != last; i++) unguarded_linear_insert(i);
    } else {
        insertion_sort(first, last);
    }
}

void dsv4_topk_torch(const float *v, int n, int k, int *out) {
    if (k <= 0) return;
    elem *q = malloc(sizeof(elem) * (size_t)n);
    for (int i = 0; i < n; i++) q[i] = (elem){v[i], i};
    if ((long)k * 64 <= n) { /* std::partial_sort */
        heap_select(q, k, n);
        sort_heap(q, k);
    } else { /* std::nth_element, then (sorted = True) std::sort of the first k - 1 */
        nth_element(q, q + k - 1, q + n);
        sort(q, q + k - 1);
    }
    for (int i = 0; i < k; i++) out[i] = q[i].i;
    free(q);
}
