// What the c10d shims (c10d_store.cpp, c10d_gloo.cpp) share: the store handle the Rust side
// holds, and the one way a message is copied out to it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstddef>
#include <cstring>
#include <string>

namespace dflash_c10d {

// One rank's store, as handed to Rust (an opaque pointer there).
struct StoreHandle {
  c10::intrusive_ptr<c10d::Store> store;
};

// NUL-terminated, truncated to the caller's buffer.
inline void copy_message(const std::string& msg, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, msg.c_str(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace dflash_c10d
