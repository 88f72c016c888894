#include "dbus/variant.hpp"

#include <vector>

namespace airs::dbus {

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
