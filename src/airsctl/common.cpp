// SPDX-License-Identifier: Apache-2.0
#include "airsctl/common.hpp"

#include <fmt/format.h>

#include "dbus/names.hpp"
#include "util/units.hpp"

namespace airs::cli {

std::unique_ptr<sdbus::IConnection> connect(const Globals& g) {
  if (g.bus == "system") return sdbus::createSystemBusConnection();
  if (g.bus == "session") return sdbus::createSessionBusConnection();
  return sdbus::createSessionBusConnectionWithAddress(g.bus);
}

std::unique_ptr<dbus::ManagerCalls> manager_proxy(sdbus::IConnection& bus) {
  return std::make_unique<dbus::ManagerCalls>(bus);
}

int report(const sdbus::Error& e) {
  std::string hint;
  if (e.getName() == "org.freedesktop.DBus.Error.ServiceUnknown" || e.getName() == "org.freedesktop.DBus.Error.NameHasNoOwner")
    hint = " (is airs-memd running? systemctl status airs-memd)";
  std::fprintf(stderr, "airsctl: %s%s [%s]\n", e.getMessage().c_str(), hint.c_str(), e.getName().c_str());
  if (e.getName() == dbus::kErrAccessDenied) return kExitAccessDenied;
  if (e.getName() == dbus::kErrNotFound) return kExitNotFound;
  return kExitFailure;
}

std::string bytes(uint64_t b) { return format_bytes(b); }
std::string percent(double r) { return fmt::format("{:.1f}%", r * 100.0); }

}  // namespace airs::cli
