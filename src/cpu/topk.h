/* topk.h - top-k selection that picks the same entries, in the same order, as PyTorch's CPU torch.topk, ties included.
 *
 * The official reference selects indexer entries and routed experts with torch.topk; when scores tie
 * exactly (the indexer's ReLU makes exact zeros common) the chosen set depends on the algorithm.
 * PyTorch's CPU kernel (aten TopKImpl.h) runs std::partial_sort when k * 64 <= n and
 * std::nth_element otherwise, on (value, index) pairs compared by value only; this file reproduces
 * libstdc++'s versions of both (introselect with median-of-3 pivots, heap select) step by step. */
#ifndef DSV4_CPU_TOPK_H
#define DSV4_CPU_TOPK_H

/* Writes the indices of the k largest of v[0..n) to out[0..k) in the order torch.topk(sorted=True)
 * returns them: decreasing value, exact ties in the order libstdc++'s algorithms leave them
 * (std::partial_sort when k * 64 <= n; else std::nth_element, then std::sort of the first k - 1).
 * The order matters: the reference sums attention over the selected entries in this order.
 * k <= n. NaNs are not expected. */
void dsv4_topk_torch(const float *v, int n, int k, int *out);

#endif
