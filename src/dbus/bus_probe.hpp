// SPDX-License-Identifier: Apache-2.0
// A connection attempt to a bus that never blocks: sd-bus's own connect,
// authentication and Hello, driven by the caller's event loop. sdbus-c++ 1.2
// can only open a connection by waiting for that handshake (up to sd-bus's
// authentication timeout, 90 s, when a socket accepts but nobody answers:
// a bus being restarted behind systemd's socket, a hung bus). A daemon that
// serves page faults must never wait like that, so it first proves with a
// probe that the bus answers, and only then opens its real connection
// (which then completes in one round trip).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "util/result.hpp"

struct sd_bus;

namespace airs::dbus {

class BusProbe {
 public:
  // Starts connecting to `address`: "system" (DBUS_SYSTEM_BUS_ADDRESS or
  // the default socket), "session" (DBUS_SESSION_BUS_ADDRESS) or a D-Bus
  // address ("unix:path=..."). Fails at once when the connection cannot
  // even start (no socket, refused, a malformed address); the message says
  // which address and why.
  static Result<std::unique_ptr<BusProbe>> start(const std::string& address);
  ~BusProbe();
  BusProbe(const BusProbe&) = delete;
  BusProbe& operator=(const BusProbe&) = delete;

  // The fd to wait on and the epoll events it waits for now (EPOLLIN,
  // EPOLLOUT); the events change as the handshake goes on: ask after each
  // advance().
  [[nodiscard]] int fd() const;
  [[nodiscard]] uint32_t events() const;
  // Processes what arrived: true once the bus answered the Hello (it is
  // there and serving), false while the handshake goes on, an error when
  // the bus closed the connection or refused it.
  [[nodiscard]] Result<bool> advance();

 private:
  BusProbe(sd_bus* bus, std::string address) : bus_(bus), address_(std::move(address)) {}
  sd_bus* bus_;
  std::string address_;
};

}  // namespace airs::dbus
