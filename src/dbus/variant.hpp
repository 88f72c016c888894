// SPDX-License-Identifier: Apache-2.0
// Helpers for a{sv} dictionaries: building them in the daemon and turning
// them into JSON in airsctl (--json).
#pragma once

#include <cstdint>
#include <map>
#include <initializer_list>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <sdbus-c++/sdbus-c++.h>

namespace airs::dbus {

using Dict = std::map<std::string, sdbus::Variant>;

// Any variant built from the types we put on the bus (s b y q u t i x d o,
// arrays of those, a{sv}, aa{sv}) as JSON.
[[nodiscard]] nlohmann::json to_json(const sdbus::Variant& v);
[[nodiscard]] nlohmann::json to_json(const Dict& d);

// The keys a method accepts in an options dictionary, with their D-Bus
// signature ("s", "b", "t", ...; several alternatives as "o|s").
struct OptionSpec {
  const char* key;
  const char* signature;
};
// Strict options: an unknown key or a value of another type is a named
// InvalidArgument error ("LoadModel: option 'name' must be s, got u;
// accepted: name (s)"). Throws sdbus::Error. Nothing is silently ignored.
void check_options(const Dict& d, std::initializer_list<OptionSpec> accepted, const char* method);

// Typed lookups in a received dictionary; nullopt when absent or of another type.
template <typename T>
std::optional<T> get(const Dict& d, const std::string& key) {
  auto it = d.find(key);
  if (it == d.end() || !it->second.containsValueOfType<T>()) return std::nullopt;
  return it->second.get<T>();
}

}  // namespace airs::dbus
