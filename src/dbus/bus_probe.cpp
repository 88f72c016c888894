// SPDX-License-Identifier: Apache-2.0
#include "dbus/bus_probe.hpp"

#include <poll.h>
#include <sys/epoll.h>

#include <cstring>

#include <systemd/sd-bus.h>

namespace airs::dbus {
namespace {
// sd-bus errors are negative errno values.
Error probe_error(int r, const std::string& address, const char* what) {
  return make_error(-r, "the bus at {}: {}: {}", address, what, std::strerror(-r));
}
}  // namespace

Result<std::unique_ptr<BusProbe>> BusProbe::start(const std::string& address) {
  sd_bus* bus = nullptr;
  int r = 0;
  // The same three ways sdbus-c++ opens its connections (system, session,
  // an address as a bus client); each only starts the connect here.
  if (address == "system") {
    r = sd_bus_open_system(&bus);
  } else if (address == "session") {
    r = sd_bus_open_user(&bus);
  } else {
    r = sd_bus_new(&bus);
    if (r >= 0) r = sd_bus_set_address(bus, address.c_str());
    if (r >= 0) r = sd_bus_set_bus_client(bus, 1);
    if (r >= 0) r = sd_bus_start(bus);
  }
  if (r < 0) {
    if (bus != nullptr) sd_bus_close_unref(bus);
    return probe_error(r, address, "cannot connect");
  }
  return std::unique_ptr<BusProbe>(new BusProbe(bus, address));
}

BusProbe::~BusProbe() {
  // Closes without flushing: nothing of ours is worth waiting for.
  sd_bus_close_unref(bus_);
}

int BusProbe::fd() const { return sd_bus_get_fd(bus_); }

uint32_t BusProbe::events() const {
  const int e = sd_bus_get_events(bus_);
  uint32_t out = 0;
  if (e > 0 && (e & POLLIN) != 0) out |= EPOLLIN;
  if (e > 0 && (e & POLLOUT) != 0) out |= EPOLLOUT;
  return out;
}

Result<bool> BusProbe::advance() {
  for (;;) {
    if (sd_bus_is_ready(bus_) > 0) return true;
    const int r = sd_bus_process(bus_, nullptr);
    if (r < 0) return probe_error(r, address_, "the connection failed");
    if (sd_bus_is_open(bus_) <= 0) return make_error(ECONNRESET, "the bus at {} closed the connection", address_);
    if (r == 0) return sd_bus_is_ready(bus_) > 0;
  }
}

}  // namespace airs::dbus
