// libtorch's current CUDA stream for a device, for the engine's NCCL collectives (tch does not
// expose it).
//
// Compiled by engine/build.rs with the `cc` crate against the headers of the same torch wheel,
// only when the wheel has libc10_cuda.so. Only the generic c10 device-guard interface is used
// (the CUDA one is registered by libc10_cuda.so when it is loaded), so no CUDA toolkit headers
// are needed: the wheel ships an incomplete set. `Stream::native_handle()` is what
// ProcessGroupNCCL-style callers use to get the `cudaStream_t`. No C++ exception crosses the C
// ABI.
//
// NOT TESTED ON A GPU: on the CPU build machines the call returns an error (no CUDA device).
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstddef>
#include <cstring>
#include <exception>

extern "C" {

static void copy_message(const char* msg, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, msg, err_len - 1);
  err[err_len - 1] = '\0';
}

// Writes the cudaStream_t libtorch's current stream for `device` on the calling thread maps to
// (the legacy default stream is the null handle). Returns 0 on success, 1 with a message.
int dflash_current_cuda_stream(int device, void** out, char* err, size_t err_len) {
  try {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) {
      copy_message("libc10_cuda is not loaded", err, err_len);
      return 1;
    }
    const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    if (device < 0 || device >= static_cast<int>(guard->deviceCount())) {
      copy_message("no such CUDA device", err, err_len);
      return 1;
    }
    const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    *out = guard->getStream(dev).native_handle();
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), err, err_len);
  } catch (...) {
    copy_message("unknown C++ exception reading the current CUDA stream", err, err_len);
  }
  return 1;
}

}  // extern "C"

// The engine's SDPA choice (engine/src/sdpa.rs): no cuDNN attention. Biased attention with a
// new (rows, keys) shape per chunk would build a cuDNN plan per shape.
#include <ATen/Context.h>
extern "C" void dflash_disable_cudnn_sdpa() { at::globalContext().setSDPUseCuDNN(false); }
