// SPDX-License-Identifier: Apache-2.0
// Typed calls on airs-memd's objects for the client library and airsctl,
// through the proxies generated from org.aios.Airs1.xml (dbus_gen/proxy.h):
// an interface, method or argument renamed or retyped in the XML fails the
// build of every caller instead of a call at run time. Open's 24 h timeout
// (it waits for the whole fill) is the XML's Method.Timeout annotation.
//
// Method calls and properties only: the signal handlers the generated
// classes declare are stored but never subscribed (finishRegistration is
// not called), so holding one adds no match rule on the bus.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "dbus/names.hpp"
#include "dbus_gen/proxy.h"

namespace airs::dbus {

namespace detail {
// Constructed before the generated base that keeps a reference to it.
struct ProxyHolder {
  std::unique_ptr<sdbus::IProxy> owned_;
};
}  // namespace detail

// org.aios.Airs1.Manager at /org/aios/Airs1.
class ManagerCalls final : private detail::ProxyHolder, public org::aios::Airs1::Manager_proxy {
 public:
  explicit ManagerCalls(sdbus::IConnection& bus)
      : ProxyHolder{sdbus::createProxy(bus, kBusName, kManagerPath)}, Manager_proxy(*owned_) {}
  ~ManagerCalls() = default;

 private:
  void onPressureChanged(const std::string&, const std::map<std::string, sdbus::Variant>&) override {}
  void onEvicted(const sdbus::ObjectPath&, const std::vector<uint32_t>&, const uint64_t&, const std::string&) override {}
};

// org.aios.Airs1.Model at a model's object path.
class ModelCalls final : private detail::ProxyHolder, public org::aios::Airs1::Model_proxy {
 public:
  ModelCalls(sdbus::IConnection& bus, const std::string& path)
      : ProxyHolder{sdbus::createProxy(bus, kBusName, path)}, Model_proxy(*owned_) {}
  ~ModelCalls() = default;

 private:
  void onResident() override {}
};

// org.aios.Airs1.Session at a session's object path.
class SessionCalls final : private detail::ProxyHolder, public org::aios::Airs1::Session_proxy {
 public:
  SessionCalls(sdbus::IConnection& bus, const std::string& path)
      : ProxyHolder{sdbus::createProxy(bus, kBusName, path)}, Session_proxy(*owned_) {}
  ~SessionCalls() = default;

  // SetLength sent one way: returns once the message is written or queued,
  // no reply is awaited (a refusal shows at the next synchronous call). The
  // generated proxy only makes calls that wait, so this is the one method
  // name spelled here; it must stay the XML's SetLength(u).
  void PostSetLength(uint32_t tokens) {
    auto call = owned_->createMethodCall(INTERFACE_NAME, "SetLength");
    call << tokens;
    call.dontExpectReply();
    owned_->callMethod(call);
  }

 private:
  void onEvicted(const std::vector<uint32_t>&, const std::string&) override {}
};

}  // namespace airs::dbus
