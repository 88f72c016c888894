// SPDX-License-Identifier: Apache-2.0
// Shared plumbing for airsctl subcommands: the bus connection, proxies, and
// output helpers. Each subcommand lives in its own file and registers itself
// from main.cpp.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sdbus-c++/sdbus-c++.h>

#include "dbus/proxies.hpp"
#include "dbus/variant.hpp"

namespace airs::cli {

// Exit status of airsctl (docs/man/airsctl.1, EXIT STATUS).
inline constexpr int kExitFailure = 1;       // daemon unreachable, bad file, daemon error
inline constexpr int kExitUsage = 2;         // the command line is rejected
inline constexpr int kExitAccessDenied = 3;  // the bus policy or the daemon refused
inline constexpr int kExitNotFound = 4;      // no such model, session or tensor
inline constexpr int kExitShortfall = 5;     // evict: the request could not be covered

// The "schema" field of every --json document: bumped when a field is
// removed or changes meaning (new fields may appear at any version).
inline constexpr int kJsonSchema = 1;

struct Globals {
  std::string bus = "system";  // system, session or an address
  bool json = false;
};

// Connects to the bus named by g.bus. Throws sdbus::Error with a message
// that says what to check.
std::unique_ptr<sdbus::IConnection> connect(const Globals& g);
// Typed calls on the manager object (the generated proxy).
std::unique_ptr<dbus::ManagerCalls> manager_proxy(sdbus::IConnection& bus);

// Prints an sdbus::Error as one line on stderr and returns the exit code
// (kExitAccessDenied, kExitNotFound, kExitFailure otherwise).
int report(const sdbus::Error& e);

// The value of key k in a reply's dictionary, or def when the key is
// missing or holds another type.
template <typename T>
T val(const dbus::Dict& d, const char* k, T def = {}) {
  auto v = dbus::get<T>(d, k);
  return v ? *v : def;
}

// Human formatting helpers.
std::string bytes(uint64_t b);
std::string percent(double ratio);

}  // namespace airs::cli
