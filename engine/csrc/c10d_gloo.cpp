// libtorch's own Gloo backend, c10d::ProcessGroupGloo (compiled into libtorch_cpu.so), behind a
// small C API for the engine's `dist::gloo` (engine/src/dist/gloo.rs).
//
// The wheel ships no gloo headers, and ProcessGroupGloo.hpp includes five of them, so this file
// is compiled against Debian's libgloo-dev (0.0~git20220518), only for its declarations.
// Nothing of Debian's libgloo is linked or loaded: every gloo function this process runs is
// libtorch_cpu.so's own copy. That is sound only because this file's inline code touches no
// gloo type's layout: ProcessGroupGloo and its Options hold gloo objects only behind
// std::shared_ptr / std::unique_ptr / std::vector of them (same size whatever the gloo
// version), this file never names GlooStore (whose vtable differs between the two gloo
// versions: libtorch's has the v2 store API), nor ProcessGroupGloo::setTimeout (inline, calls
// gloo::Context), and the vtables of ProcessGroupGloo and its work items are libtorch's (their
// key functions are out of line there). `nm -C` of the compiled object names no gloo:: symbol
// but std::vector<std::shared_ptr<gloo::transport::Device>> (docs/SCALING.md, "Backends").
//
// Timeouts: the group's rendezvous and every collective are bounded by the caller's timeout
// (gloo's own, set through the options, plus our wait for the work's future). Abort: torch
// 2.11's ProcessGroupGloo does not override Backend::abort (a no-op), so an abort here releases
// the rank waiting in a collective and refuses later ones; the gloo thread still running the
// abandoned collective ends at gloo's own timeout.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "c10d_common.h"

using dflash_c10d::copy_message;

namespace {

constexpr int kOk = 0;
constexpr int kError = 1;
constexpr int kTimeout = 2;
constexpr int kAborted = 3;

// A collective's grace beyond gloo's own timeout, so gloo's more precise error wins the race.
constexpr std::chrono::milliseconds kWaitGrace{1000};

// Shared by a waiting collective, the future callbacks and `abort` (any thread).
struct WaitState {
  std::mutex mutex;
  std::condition_variable changed;
  bool aborted = false;
};

struct GlooHandle {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  std::shared_ptr<WaitState> wait;
};

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown C++ exception";
  }
}

}  // namespace

extern "C" {

// Joins the group of `size` ranks through `store` (under `prefix`, so gloo's keys never meet
// the caller's): every rank publishes its address and connects to all others, within
// `timeout_ms`. The transport binds `hostname` when given (the address peers reach this rank
// at), else the network interface `interface` when given, else libtorch's default (this
// machine's hostname, falling back to loopback).
int dflash_c10d_gloo_new(dflash_c10d::StoreHandle* store, const char* prefix, int rank, int size,
                         int64_t timeout_ms, const char* hostname, const char* interface,
                         GlooHandle** out, char* err, size_t err_len) {
  try {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (hostname != nullptr) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
    } else if (interface != nullptr) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    opts->threads = 1;
    auto scoped = c10::make_intrusive<c10d::PrefixStore>(prefix, store->store);
    scoped->setTimeout(timeout);
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(scoped, rank, size, opts);
    *out = new GlooHandle{std::move(group), std::make_shared<WaitState>()};
    return kOk;
  } catch (const std::exception& e) {
    copy_message(std::string("joining the Gloo group: ") + what_of(std::current_exception()), err,
                 err_len);
  } catch (...) {
    copy_message("joining the Gloo group: unknown C++ exception", err, err_len);
  }
  return kError;
}

// In-place sum over the group of `tensor` (an at::Tensor*, as tch's C_tensor is: dense,
// contiguous, CPU). 0: done; 1: the collective failed (message: gloo's, naming the peer
// address when a connection closed); 2: not done within `timeout_ms`; 3: aborted.
int dflash_c10d_gloo_allreduce_sum(GlooHandle* handle, void* tensor, int64_t timeout_ms,
                                   char* err, size_t err_len) {
  try {
    auto wait = handle->wait;
    {
      std::lock_guard<std::mutex> lock(wait->mutex);
      if (wait->aborted) {
        copy_message("the group was aborted", err, err_len);
        return kAborted;
      }
    }
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    auto work = handle->group->allreduce(tensors, opts);
    auto future = work->getFuture();
    auto done = std::make_shared<bool>(false);
    future->addCallback([wait, done](c10::ivalue::Future&) {
      {
        std::lock_guard<std::mutex> lock(wait->mutex);
        *done = true;
      }
      wait->changed.notify_all();
    });
    {
      std::unique_lock<std::mutex> lock(wait->mutex);
      wait->changed.wait_for(lock, opts.timeout + kWaitGrace,
                             [&] { return *done || wait->aborted; });
      if (!*done) {
        bool aborted = wait->aborted;
        copy_message(aborted ? "the group was aborted while this rank waited in an all-reduce"
                             : "no result within the timeout",
                     err, err_len);
        return aborted ? kAborted : kTimeout;
      }
    }
    if (future->hasError()) {
      copy_message(future->tryRetrieveErrorMessage(), err, err_len);
      return kError;
    }
    return kOk;
  } catch (...) {
    copy_message(what_of(std::current_exception()), err, err_len);
  }
  return kError;
}

// Any thread: releases a rank waiting in a collective and refuses every later one.
void dflash_c10d_gloo_abort(GlooHandle* handle) {
  {
    std::lock_guard<std::mutex> lock(handle->wait->mutex);
    handle->wait->aborted = true;
  }
  handle->wait->changed.notify_all();
}

// Waits for the group's worker thread to finish its queue: an abandoned collective ends at
// gloo's own timeout at the latest.
void dflash_c10d_gloo_free(GlooHandle* handle) {
  try {
    delete handle;
  } catch (...) {
  }
}

}  // extern "C"
