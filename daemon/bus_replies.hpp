// The bus edge's replies: airs::Error as a named D-Bus error, received fds
// kept past the handler, and the asynchronous answer of a call that may
// have to wait for pages on their way back to the pool (DrainWaits).
#pragma once

#include <cerrno>
#include <memory>
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

// Takes ownership of a dup of a received fd (sdbus::UnixFd closes its own).
// (Invalid if the dup failed: the model call that gets it says so.)
inline sys::UniqueFd take(const sdbus::UnixFd& fd) {
  auto r = sys::dup_cloexec(fd.get());
  return r ? std::move(r).value() : sys::UniqueFd();
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
  auto run = [held, op = std::move(op), to_bus = std::move(to_bus)]() mutable -> bool {
    auto r = op();
    if (!r && r.error().code == EINPROGRESS) return false;
    try {
      if (r)
        std::apply([&](auto&&... v) { held->returnResults(v...); }, to_bus(std::move(r).value()));
      else
        held->returnError(bus_error(r.error()));
    } catch (const sdbus::Error& e) {
      spdlog::debug("answering a call: {}", e.getMessage());
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
