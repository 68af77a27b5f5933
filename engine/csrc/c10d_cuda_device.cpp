// Makes a CUDA device the calling thread's current one through libtorch's device guard, for
// NCCL's ncclCommInitRank (it binds the communicator to the current device; tch has no call
// for it). Compiled with the CUDA stream shim (same conditions: the wheel has libc10_cuda.so);
// only the generic c10 interface, no CUDA headers. No C++ exception crosses the C ABI.
//
// NOT TESTED ON A GPU: on the CPU build machines the call returns an error (no CUDA device).
#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstddef>
#include <cstring>
#include <exception>

extern "C" int dflash_set_current_cuda_device(int device, char* err, size_t err_len) {
  auto fail = [&](const char* msg) {
    if (err != nullptr && err_len > 0) {
      std::strncpy(err, msg, err_len - 1);
      err[err_len - 1] = '\0';
    }
    return 1;
  };
  try {
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return fail("libc10_cuda is not loaded");
    const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    if (device < 0 || device >= static_cast<int>(guard->deviceCount())) return fail("no such CUDA device");
    guard->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown C++ exception setting the current CUDA device");
  }
}
