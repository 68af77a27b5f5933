// libtorch caching-allocator statistics for dflashd (tch does not expose them).
//
// Compiled by daemon/build.rs with the `cc` crate against the headers shipped in the torch
// wheel. Only the generic c10::DeviceAllocator interface is used, so no CUDA toolkit headers
// are needed; the CUDA allocator itself is registered by libc10_cuda.so when it is loaded.
// The CUDA query is compiled only when the wheel ships libc10_cuda.so (DFLASH_HAVE_C10_CUDA),
// and the Rust side calls it only when CUDA is available. No C++ exception crosses the C ABI.
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/headeronly/version.h>

#include <cstdint>
#include <cstring>
#include <exception>

extern "C" {

struct DflashAllocatorStats {
  int64_t allocated_current;
  int64_t allocated_peak;
  int64_t reserved_current;
  int64_t reserved_peak;
  int64_t active_peak;
  int64_t num_alloc_retries;
  int64_t num_ooms;
};

// Status codes returned by dflash_cuda_allocator_stats.
enum {
  DFLASH_ALLOC_OK = 0,
  DFLASH_ALLOC_NOT_COMPILED = 1,
  DFLASH_ALLOC_ERROR = 2,
};

// The torch version of the headers this shim was compiled against.
const char* dflash_torch_header_version() { return TORCH_VERSION; }

int dflash_cuda_allocator_compiled() {
#ifdef DFLASH_HAVE_C10_CUDA
  return 1;
#else
  return 0;
#endif
}

static void copy_message(const char* msg, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, msg, err_len - 1);
  err[err_len - 1] = '\0';
}

#ifdef DFLASH_HAVE_C10_CUDA
// Runs `query` with every C++ exception turned into DFLASH_ALLOC_ERROR and its message, since
// none may cross the C ABI.
extern "C++" {
template <typename Query>
static int guarded(Query query, char* err, size_t err_len) {
  try {
    return query();
  } catch (const std::exception& e) {
    copy_message(e.what(), err, err_len);
  } catch (...) {
    copy_message("unknown C++ exception from the CUDA caching allocator", err, err_len);
  }
  return DFLASH_ALLOC_ERROR;
}
}
#else
static int not_compiled(char* err, size_t err_len) {
  copy_message("this dflashd was built against a torch without libc10_cuda.so", err, err_len);
  return DFLASH_ALLOC_NOT_COMPILED;
}
#endif

int dflash_cuda_allocator_stats(int device, DflashAllocatorStats* out, char* err, size_t err_len) {
#ifdef DFLASH_HAVE_C10_CUDA
  return guarded(
      [&] {
        auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
        if (!allocator->initialized()) {
          copy_message("the CUDA caching allocator is not initialized yet", err, err_len);
          return static_cast<int>(DFLASH_ALLOC_ERROR);
        }
        const auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(device));
        const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
        out->allocated_current = stats.allocated_bytes[agg].current;
        out->allocated_peak = stats.allocated_bytes[agg].peak;
        out->reserved_current = stats.reserved_bytes[agg].current;
        out->reserved_peak = stats.reserved_bytes[agg].peak;
        out->active_peak = stats.active_bytes[agg].peak;
        out->num_alloc_retries = stats.num_alloc_retries;
        out->num_ooms = stats.num_ooms;
        return static_cast<int>(DFLASH_ALLOC_OK);
      },
      err, err_len);
#else
  (void)device;
  (void)out;
  return not_compiled(err, err_len);
#endif
}

// Resets the peak counters so each telemetry window reports its own peak (torchtitan style).
int dflash_cuda_allocator_reset_peak(int device, char* err, size_t err_len) {
#ifdef DFLASH_HAVE_C10_CUDA
  return guarded(
      [&] {
        c10::getDeviceAllocator(c10::DeviceType::CUDA)
            ->resetPeakStats(static_cast<c10::DeviceIndex>(device));
        return static_cast<int>(DFLASH_ALLOC_OK);
      },
      err, err_len);
#else
  (void)device;
  return not_compiled(err, err_len);
#endif
}

}  // extern "C"
