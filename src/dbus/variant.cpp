// SPDX-License-Identifier: Apache-2.0
#include "dbus/variant.hpp"

#include <vector>

#include <fmt/format.h>

#include "util/text.hpp"

#include "dbus/names.hpp"

namespace airs::dbus {

void check_options(const Dict& d, std::initializer_list<OptionSpec> accepted, const char* method) {
  auto list = [&] {
    std::string l;
    for (const auto& a : accepted) l += fmt::format("{}{} ({})", l.empty() ? "" : ", ", a.key, a.signature);
    return l.empty() ? std::string("none") : l;
  };
  for (const auto& [k, v] : d) {
    const OptionSpec* spec = nullptr;
    for (const auto& a : accepted)
      if (k == a.key) spec = &a;
    if (spec == nullptr)
      throw sdbus::Error(kErrInvalidArgument, fmt::format("{}: unknown option '{}'; accepted: {}", method,
                                                          printable_name(k), list()));
    const std::string sig = v.peekValueType();
    bool ok = false;
    std::string_view alts = spec->signature;
    for (size_t pos = 0; pos <= alts.size();) {
      const size_t bar = alts.find('|', pos);
      const std::string_view one = alts.substr(pos, bar == std::string_view::npos ? std::string_view::npos : bar - pos);
      ok = ok || one == sig;
      if (bar == std::string_view::npos) break;
      pos = bar + 1;
    }
    if (!ok)
      throw sdbus::Error(kErrInvalidArgument, fmt::format("{}: option '{}' must be of type {}, got {}", method, k,
                                                          spec->signature, printable_name(sig)));
  }
}

nlohmann::json to_json(const Dict& d) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : d) j[k] = to_json(v);
  return j;
}

nlohmann::json to_json(const sdbus::Variant& v) {
  const std::string sig = v.peekValueType();
  if (sig == "s") return v.get<std::string>();
  if (sig == "o") return std::string(v.get<sdbus::ObjectPath>());
  if (sig == "b") return v.get<bool>();
  if (sig == "y") return v.get<uint8_t>();
  if (sig == "q") return v.get<uint16_t>();
  if (sig == "u") return v.get<uint32_t>();
  if (sig == "t") return v.get<uint64_t>();
  if (sig == "n") return v.get<int16_t>();
  if (sig == "i") return v.get<int32_t>();
  if (sig == "x") return v.get<int64_t>();
  if (sig == "d") return v.get<double>();
  if (sig == "as") return v.get<std::vector<std::string>>();
  if (sig == "au") return v.get<std::vector<uint32_t>>();
  if (sig == "at") return v.get<std::vector<uint64_t>>();
  if (sig == "ad") return v.get<std::vector<double>>();
  if (sig == "ao") {
    nlohmann::json a = nlohmann::json::array();
    for (auto& p : v.get<std::vector<sdbus::ObjectPath>>()) a.push_back(std::string(p));
    return a;
  }
  if (sig == "a{sv}") return to_json(v.get<Dict>());
  if (sig == "aa{sv}") {
    nlohmann::json a = nlohmann::json::array();
    for (auto& d : v.get<std::vector<Dict>>()) a.push_back(to_json(d));
    return a;
  }
  return "<" + sig + ">";
}

}  // namespace airs::dbus
