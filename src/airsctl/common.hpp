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

#include "dbus/variant.hpp"

namespace airs::cli {

struct Globals {
  std::string bus = "system";  // system, session or an address
  bool json = false;
};

// Connects to the bus named by g.bus. Throws sdbus::Error with a message
// that says what to check.
std::unique_ptr<sdbus::IConnection> connect(const Globals& g);
// A proxy for the manager object.
std::unique_ptr<sdbus::IProxy> manager_proxy(sdbus::IConnection& bus);

// Prints an sdbus::Error as one line on stderr and returns the exit code
// (3 access denied, 4 not found, 1 otherwise).
int report(const sdbus::Error& e);

// Human formatting helpers.
std::string bytes(uint64_t b);
std::string percent(double ratio);

}  // namespace airs::cli
