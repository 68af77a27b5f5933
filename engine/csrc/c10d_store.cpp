// libtorch's own rendezvous store, c10d::TCPStore, behind a small C API for the engine's
// `dist::store` (engine/src/dist/store.rs).
//
// Compiled by engine/build.rs against the headers of the same torch wheel; the symbols are
// libtorch_cpu.so's. Values are bytes. Every wait takes a timeout from the caller (the store's
// own default, 300 s, is never used), and no C++ exception crosses the C ABI: each entry point
// catches and returns 1 with a message (2 for a wait that timed out).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "c10d_common.h"

using dflash_c10d::copy_message;

namespace {

constexpr int kOk = 0;
constexpr int kError = 1;
constexpr int kTimeout = 2;

std::vector<std::string> key_list(const char* const* keys, size_t n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.emplace_back(keys[i]);
  return out;
}

// Runs `body`, turning every C++ exception into a message. A DistStoreError out of a wait is
// c10d's "wait timeout after ..." (a lost server is DistNetworkError), so `waits` maps it to
// kTimeout.
template <typename F>
int guarded(const char* what, char* err, size_t err_len, bool waits, F&& body) {
  try {
    body();
    return kOk;
  } catch (const c10::DistNetworkError& e) {
    copy_message(std::string(what) + ": " + e.what_without_backtrace(), err, err_len);
    return kError;
  } catch (const c10::DistStoreError& e) {
    copy_message(std::string(what) + ": " + e.what_without_backtrace(), err, err_len);
    return waits ? kTimeout : kError;
  } catch (const c10::Error& e) {
    copy_message(std::string(what) + ": " + e.what_without_backtrace(), err, err_len);
  } catch (const std::exception& e) {
    copy_message(std::string(what) + ": " + e.what(), err, err_len);
  } catch (...) {
    copy_message(std::string(what) + ": unknown C++ exception", err, err_len);
  }
  return kError;
}

}  // namespace

extern "C" {

// A TCPStore: the server (rank 0, `is_master`) binds `host:port` (port 0: any free port,
// written to `bound_port`); a client connects to it, retrying until `timeout_ms`. Neither
// waits for the other ranks here (the process group's own rendezvous does), so a server on
// port 0 can publish its port first.
int dflash_c10d_tcp_store_new(const char* host, uint16_t port, size_t world_size, int is_master,
                              int64_t timeout_ms, dflash_c10d::StoreHandle** out,
                              uint16_t* bound_port, char* err, size_t err_len) {
  return guarded(is_master ? "starting the TCPStore server" : "connecting to the TCPStore",
                 err, err_len, false, [&] {
                   c10d::TCPStoreOptions opts;
                   opts.port = port;
                   opts.isServer = is_master != 0;
                   opts.numWorkers = world_size;
                   opts.waitWorkers = false;
                   opts.timeout = std::chrono::milliseconds(timeout_ms);
                   auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
                   *bound_port = store->getPort();
                   *out = new dflash_c10d::StoreHandle{std::move(store)};
                 });
}

void dflash_c10d_store_free(dflash_c10d::StoreHandle* store) { delete store; }

int dflash_c10d_store_set(dflash_c10d::StoreHandle* store, const char* key, const uint8_t* value,
                          size_t len, char* err, size_t err_len) {
  return guarded("store set", err, err_len, false, [&] {
    store->store->set(key, std::vector<uint8_t>(value, value + len));
  });
}

// Waits up to `timeout_ms` for `key`, then reads it into a malloc'd buffer the caller frees
// with dflash_c10d_bytes_free.
int dflash_c10d_store_get(dflash_c10d::StoreHandle* store, const char* key, int64_t timeout_ms,
                          uint8_t** out, size_t* out_len, char* err, size_t err_len) {
  int rc = guarded("store wait", err, err_len, true, [&] {
    store->store->wait({std::string(key)}, std::chrono::milliseconds(timeout_ms));
  });
  if (rc != kOk) return rc;
  return guarded("store get", err, err_len, false, [&] {
    std::vector<uint8_t> value = store->store->get(key);
    auto* buf = static_cast<uint8_t*>(std::malloc(value.empty() ? 1 : value.size()));
    if (buf == nullptr) throw std::bad_alloc();
    if (!value.empty()) std::memcpy(buf, value.data(), value.size());
    *out = buf;
    *out_len = value.size();
  });
}

void dflash_c10d_bytes_free(uint8_t* bytes) { std::free(bytes); }

int dflash_c10d_store_wait(dflash_c10d::StoreHandle* store, const char* const* keys, size_t n,
                           int64_t timeout_ms, char* err, size_t err_len) {
  return guarded("store wait", err, err_len, true, [&] {
    store->store->wait(key_list(keys, n), std::chrono::milliseconds(timeout_ms));
  });
}

int dflash_c10d_store_add(dflash_c10d::StoreHandle* store, const char* key, int64_t delta,
                          int64_t* out, char* err, size_t err_len) {
  return guarded("store add", err, err_len, false,
                 [&] { *out = store->store->add(key, delta); });
}

int dflash_c10d_store_check(dflash_c10d::StoreHandle* store, const char* const* keys, size_t n,
                            int* out, char* err, size_t err_len) {
  return guarded("store check", err, err_len, false,
                 [&] { *out = store->store->check(key_list(keys, n)) ? 1 : 0; });
}

}  // extern "C"
