// SPDX-License-Identifier: Apache-2.0
// The bus edge's replies: airs::Error as a named D-Bus error, received fds
// kept past the handler, the asynchronous answer of a call that may have to
// wait for pages on their way back to the pool (DrainWaits), and the guard
// every handler's body runs in.
#pragma once

#include <cerrno>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <sdbus-c++/sdbus-c++.h>
#include <spdlog/spdlog.h>

#include "daemon/drain_waits.hpp"
#include "dbus/identity.hpp"
#include "dbus/names.hpp"
#include "sys/fd.hpp"
#include "sys/files.hpp"
#include "util/result.hpp"

namespace airs::daemon {

// The named D-Bus error dbus::throw_error would throw for `e`.
inline sdbus::Error bus_error(const Error& e) {
  try {
    dbus::throw_error(e);
  } catch (const sdbus::Error& be) {
    return be;
  }
}

// What a handler's exception that is not an sdbus::Error becomes: Failed,
// naming the method; the log says so too.
inline sdbus::Error edge_error(const char* method, const std::exception& e) {
  spdlog::error("bus: {} failed: {}", method, e.what());
  return sdbus::Error(dbus::kErrFailed, fmt::format("{}: airs-memd failed: {}", method, e.what()));
}

// Runs a handler's body at the bus edge. sdbus-c++ turns an sdbus::Error
// into the caller's D-Bus error, but lets any other exception unwind
// through sd-bus, which leaves the connection mid-dispatch and unusable for
// every client: here it becomes the caller's Failed error instead.
template <class F>
decltype(auto) at_bus_edge(const char* method, F&& body) {
  try {
    return std::forward<F>(body)();
  } catch (const sdbus::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw edge_error(method, e);
  }
}

// Takes ownership of a dup of a received fd (sdbus::UnixFd closes its own).
// (Invalid if the dup failed: the model call that gets it says so.)
inline sys::UniqueFd take(const sdbus::UnixFd& fd) {
  auto r = sys::dup_cloexec(fd.get());
  return r ? std::move(r).value() : sys::UniqueFd();
}

// Answers `reply` with `e` as its named D-Bus error; a reply the bus does
// not take (the caller gone) is only logged, naming `what`.
template <class... Out>
void answer_error(sdbus::Result<Out...>& reply, const Error& e, const std::string& what) {
  try {
    reply.returnError(bus_error(e));
  } catch (const sdbus::Error& be) {
    spdlog::debug("answering {}: {}", what, be.getMessage());
  }
}

// Runs `op` (a copyable callable returning Result<T>) and answers `reply`
// with to_bus(T) (a tuple of the method's outputs) or the error. When it
// says EINPROGRESS the call is parked in `waits` and runs again at each
// drain until it answers something else (or is refused or forgotten
// there). `caller`: the bus unique name (its leaving drops the call).
template <class... Out, class Op, class ToBus>
void answer_when_room(DrainWaits* waits, sdbus::Result<Out...>&& reply, const std::string& caller, std::string what,
                      Op op, ToBus to_bus) {
  auto held = std::make_shared<sdbus::Result<Out...>>(std::move(reply));
  // A retry runs on the loop outside any handler (DrainWaits): nothing may
  // leave it, neither the operation's exceptions nor a reply the bus does
  // not take (a connection going away).
  auto run = [held, op = std::move(op), to_bus = std::move(to_bus), what]() mutable -> bool {
    std::optional<sdbus::Error> failed;
    try {
      auto r = op();
      if (!r && r.error().code == EINPROGRESS) return false;
      if (!r) {
        failed = bus_error(r.error());
      } else {
        try {
          std::apply([&](auto&&... v) { held->returnResults(v...); }, to_bus(std::move(r).value()));
        } catch (const sdbus::Error& e) {
          spdlog::debug("answering {}: {}", what, e.getMessage());
        }
      }
    } catch (const sdbus::Error& e) {
      failed = e;
    } catch (const std::exception& e) {
      failed = edge_error(what.c_str(), e);
    }
    if (failed) {
      try {
        held->returnError(*failed);
      } catch (const sdbus::Error& e) {
        spdlog::debug("answering {}: {}", what, e.getMessage());
      }
    }
    return true;
  };
  if (run()) return;
  if (waits == nullptr) return held->returnError(sdbus::Error(dbus::kErrFailed, what + ": nothing drains here"));
  waits->park(DrainWaits::Call{caller, std::move(what), std::move(run), [held](const Error& e) {
                                 try {
                                   held->returnError(bus_error(e));
                                 } catch (const sdbus::Error& be) {
                                   spdlog::debug("refusing a waiting call: {}", be.getMessage());
                                 }
                               }});
}

}  // namespace airs::daemon
