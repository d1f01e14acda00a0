/* topk_algo.h - the selection of dsv4_topk_torch (topk.h): libstdc++'s heap select, introselect and
 * introsort on (value, index) pairs compared by value only (bits/stl_heap.h, bits/stl_algo.h), written
 * once for the CPU (topk.c) and the GPU (src/cuda/topk.cu, where one thread runs it for a row whose
 * selection involves exact ties). Include after defining DSV4_TK_FN (empty in C; __host__ __device__
 * in CUDA). */
#ifndef DSV4_CPU_TOPK_ALGO_H
#define DSV4_CPU_TOPK_ALGO_H

typedef struct {
    float v;
    int i;
} tk_elem;

static inline DSV4_TK_FN int tk_gt(tk_elem a, tk_elem b) { return a.v > b.v; }

static inline DSV4_TK_FN void tk_push_heap(tk_elem *f, long hole, long top, tk_elem val) {
    long parent = (hole - 1) / 2;
    while (hole > top && tk_gt(f[parent], val)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = val;
}

static inline DSV4_TK_FN void tk_adjust_heap(tk_elem *f, long hole, long len, tk_elem val) {
    long top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (tk_gt(f[child], f[child - 1])) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    tk_push_heap(f, hole, top, val);
}

static inline DSV4_TK_FN void tk_make_heap(tk_elem *f, long len) {
    if (len < 2) return;
    for (long parent = (len - 2) / 2;; parent--) {
        tk_adjust_heap(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}

static inline DSV4_TK_FN void tk_heap_select(tk_elem *f, long mid, long last) {
    tk_make_heap(f, mid);
    for (long i = mid; i < last; i++)
        if (tk_gt(f[i], f[0])) {
            tk_elem val = f[i];
            f[i] = f[0];
            tk_adjust_heap(f, 0, mid, val);
        }
}

static inline DSV4_TK_FN void tk_swap(tk_elem *a, tk_elem *b) {
    tk_elem t = *a;
    *a = *b;
    *b = t;
}

static inline DSV4_TK_FN void tk_move_median_to_first(tk_elem *r, tk_elem *a, tk_elem *b, tk_elem *c) {
    if (tk_gt(*a, *b)) {
        if (tk_gt(*b, *c)) tk_swap(r, b);
        else if (tk_gt(*a, *c)) tk_swap(r, c);
        else tk_swap(r, a);
    } else if (tk_gt(*a, *c)) tk_swap(r, a);
    else if (tk_gt(*b, *c)) tk_swap(r, c);
    else tk_swap(r, b);
}

static inline DSV4_TK_FN tk_elem *tk_unguarded_partition(tk_elem *first, tk_elem *last, tk_elem *pivot) {
    for (;;) {
        while (tk_gt(*first, *pivot)) first++;
        last--;
        while (tk_gt(*pivot, *last)) last--;
        if (!(first < last)) return first;
        tk_swap(first, last);
        first++;
    }
}

static inline DSV4_TK_FN void tk_insertion_sort(tk_elem *first, tk_elem *last) {
    if (first == last) return;
    for (tk_elem *i = first + 1; i != last; i++) {
        tk_elem val = *i;
        if (tk_gt(val, *first)) {
            for (tk_elem *j = i; j != first; j--) j[0] = j[-1];
            *first = val;
        } else {
            tk_elem *j = i;
            while (tk_gt(val, j[-1])) {
                j[0] = j[-1];
                j--;
            }
            *j = val;
        }
    }
}

static inline DSV4_TK_FN int tk_lg(long n) {
    int r = 0;
    while (n >>= 1) r++;
    return r;
}

static inline DSV4_TK_FN void tk_nth_element(tk_elem *first, tk_elem *nth, tk_elem *last) {
    if (first == last || nth == last) return;
    int depth = 2 * tk_lg(last - first);
    while (last - first > 3) {
        if (depth == 0) {
            tk_heap_select(first, nth - first + 1, last - first);
            tk_swap(first, nth);
            return;
        }
        depth--;
        tk_elem *mid = first + (last - first) / 2;
        tk_move_median_to_first(first, first + 1, mid, last - 1);
        tk_elem *cut = tk_unguarded_partition(first + 1, last, first);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    tk_insertion_sort(first, last);
}

/* std::__sort_heap: pops the heap [f, f+len) into comparator order (here: decreasing). */
static inline DSV4_TK_FN void tk_sort_heap(tk_elem *f, long len) {
    while (len > 1) {
        len--;
        tk_elem val = f[len];
        f[len] = f[0];
        tk_adjust_heap(f, 0, len, val);
    }
}

/* std::__introsort_loop. libstdc++ recurses on the right part and loops on the left; the parts are
 * disjoint, so keeping the right parts on an explicit stack (at most the depth limit, 2 log2 n < 64,
 * are pending) gives the same result without recursion (the GPU's stack is small). */
static inline DSV4_TK_FN void tk_introsort_loop(tk_elem *first, tk_elem *last, int depth) {
    tk_elem *const base = first;
    int st[64][3], sp = 0; /* pending (first, last, depth) as offsets from base */
    st[sp][0] = 0, st[sp][1] = (int)(last - first), st[sp][2] = depth, sp++;
    while (sp) {
        sp--;
        first = base + st[sp][0], last = base + st[sp][1], depth = st[sp][2];
        while (last - first > 16) {
            if (depth == 0) { /* std::__partial_sort(first, last, last) */
                tk_heap_select(first, last - first, last - first);
                tk_sort_heap(first, last - first);
                break;
            }
            depth--;
            tk_elem *mid = first + (last - first) / 2;
            tk_move_median_to_first(first, first + 1, mid, last - 1);
            tk_elem *cut = tk_unguarded_partition(first + 1, last, first);
            st[sp][0] = (int)(cut - base), st[sp][1] = (int)(last - base), st[sp][2] = depth, sp++;
            last = cut;
        }
    }
}

static inline DSV4_TK_FN void tk_unguarded_linear_insert(tk_elem *i) {
    tk_elem val = *i;
    while (tk_gt(val, i[-1])) {
        i[0] = i[-1];
        i--;
    }
    *i = val;
}

/* std::sort: introsort, then the final insertion sort (guarded over the first 16). */
static inline DSV4_TK_FN void tk_sort(tk_elem *first, tk_elem *last) {
    if (first == last) return;
    tk_introsort_loop(first, last, 2 * tk_lg(last - first));
    if (last - first > 16) {
        tk_insertion_sort(first, first + 16);
        for (tk_elem *i = first + 16; i != last; i++) tk_unguarded_linear_insert(i);
    } else {
        tk_insertion_sort(first, last);
    }
}

/* Selects the k largest of q[0..n) (k <= n) in place into q[0..k), in the order torch.topk(sorted=True)
 * returns them: std::partial_sort when k * 64 <= n, else std::nth_element then std::sort of the first
 * k - 1 (aten TopKImpl.h). */
static inline DSV4_TK_FN void tk_select_torch(tk_elem *q, int n, int k) {
    if (k <= 0) return;
    if ((long)k * 64 <= n) { /* std::partial_sort */
        tk_heap_select(q, k, n);
        tk_sort_heap(q, k);
    } else { /* std::nth_element, then (sorted = True) std::sort of the first k - 1 */
        tk_nth_element(q, q + k - 1, q + n);
        tk_sort(q, q + k - 1);
    }
}

#endif
