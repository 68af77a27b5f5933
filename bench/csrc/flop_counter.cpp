// Counts the FLOPs libtorch actually executes, op by op, through a RecordFunction callback:
// the benchmark's measured side of the FLOP model (`dflash_engine::plan::flops`).
//
// Why at the dispatcher: every matmul and attention kernel the engine runs (forward,
// recomputation, and the autograd engine's backward formulas) is a dispatcher call whose
// inputs carry their shapes, so the count needs no knowledge of the engine's code and cannot
// drift from it. Only leaf kernels are counted (composites such as aten::linear or
// aten::matmul end in one of them), with the conventions of torch.utils.flop_counter:
// a multiply-add is 2 FLOPs, attention forward is q·kᵀ plus p·v, its backward twice that.
//
// The callback is thread-local: only ops run by the thread that started the count, and by
// the threads the autograd engine hands that thread's state to (its device workers), are
// counted. Totals are process-wide atomics, so one count runs at a time; the Rust side
// (`bench/src/flop_counter.rs`) holds a lock for that.
#include <ATen/record_function.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace {

enum Category { kMatmul = 0, kAttentionForward = 1, kAttentionBackward = 2, kCategories = 3 };

std::atomic<uint64_t> g_flops[kCategories];
std::atomic<uint64_t> g_calls[kCategories];
thread_local at::CallbackHandle t_handle = 0;

bool sizes_of(const at::RecordFunction& fn, size_t index, c10::IntArrayRef* out) {
  auto inputs = fn.inputs();
  if (index >= inputs.size() || !inputs[index].isTensor()) {
    return false;
  }
  *out = inputs[index].toTensor().sizes();
  return true;
}

void add(Category c, double flops) {
  g_flops[c].fetch_add(static_cast<uint64_t>(flops), std::memory_order_relaxed);
  g_calls[c].fetch_add(1, std::memory_order_relaxed);
}

// [.., m, k] x [.., k, n] over `batch` products: 2·batch·m·k·n.
void count_product(const at::RecordFunction& fn, size_t a, size_t b, bool batched) {
  c10::IntArrayRef x, y;
  if (!sizes_of(fn, a, &x) || !sizes_of(fn, b, &y)) {
    return;
  }
  const size_t want = batched ? 3 : 2;
  if (x.size() != want || y.size() != want) {
    return;
  }
  const double batch = batched ? static_cast<double>(x[0]) : 1.0;
  const double m = static_cast<double>(x[want - 2]);
  const double k = static_cast<double>(x[want - 1]);
  const double n = static_cast<double>(y[want - 1]);
  add(kMatmul, 2.0 * batch * m * k * n);
}

// Attention over q [B, Hq, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev] (the layout every
// `_scaled_dot_product_*` op takes): q·kᵀ (2·B·Hq·L·S·E) plus p·v (2·B·Hq·L·S·Ev); the
// backward's four products are twice that.
void count_attention(const at::RecordFunction& fn, size_t q, bool backward) {
  c10::IntArrayRef qs, ks, vs;
  if (!sizes_of(fn, q, &qs) || !sizes_of(fn, q + 1, &ks) || !sizes_of(fn, q + 2, &vs)) {
    return;
  }
  if (qs.size() != 4 || ks.size() != 4 || vs.size() != 4) {
    return;
  }
  const double rows = static_cast<double>(qs[0]) * qs[1] * qs[2];
  const double keys = static_cast<double>(ks[2]);
  const double forward = 2.0 * rows * keys * qs[3] + 2.0 * rows * keys * vs[3];
  add(backward ? kAttentionBackward : kAttentionForward, backward ? 2.0 * forward : forward);
}

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

bool ends_with(const char* s, const char* suffix) {
  const size_t n = std::strlen(s), m = std::strlen(suffix);
  return n >= m && std::strcmp(s + n - m, suffix) == 0;
}

std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (name == nullptr || !starts_with(name, "aten::")) {
    return nullptr;
  }
  const char* op = name + 6;
  if (std::strcmp(op, "mm") == 0) {
    count_product(fn, 0, 1, false);
  } else if (std::strcmp(op, "addmm") == 0) {
    count_product(fn, 1, 2, false);
  } else if (std::strcmp(op, "bmm") == 0) {
    count_product(fn, 0, 1, true);
  } else if (std::strcmp(op, "baddbmm") == 0) {
    count_product(fn, 1, 2, true);
  } else if (starts_with(op, "_scaled_dot_product_") &&
             std::strcmp(op, "_scaled_dot_product_attention_math") != 0 &&
             std::strcmp(op, "_scaled_dot_product_attention_math_for_mps") != 0) {
    // The fused kernels (flash, flash for CPU, efficient, cuDNN); the math fallback is a
    // composite whose bmm calls are counted as matmuls. Backward ops take grad_out first.
    const bool backward = ends_with(op, "_backward");
    count_attention(fn, backward ? 1 : 0, backward);
  }
  return nullptr;
}

}  // namespace

extern "C" {

// Starts counting on this thread, from zero. 0 on success, 1 when this thread already counts.
int dflash_flop_counter_start() {
  if (t_handle != 0) {
    return 1;
  }
  for (int c = 0; c < kCategories; ++c) {
    g_flops[c].store(0);
    g_calls[c].store(0);
  }
  t_handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(on_op).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  return 0;
}

// Stops counting on this thread; writes FLOPs then calls per category (matmul, attention
// forward, attention backward) into `out[6]`. 0 on success, 1 when this thread was not counting.
int dflash_flop_counter_stop(uint64_t* out) {
  if (t_handle == 0) {
    return 1;
  }
  at::removeCallback(t_handle);
  t_handle = 0;
  for (int c = 0; c < kCategories; ++c) {
    out[c] = g_flops[c].load();
    out[kCategories + c] = g_calls[c].load();
  }
  return 0;
}

}  // extern "C"
