// SPDX-License-Identifier: Apache-2.0
#include "util/log.hpp"

#include <cstdlib>
#include <memory>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace airs {
namespace {

// "%*" → "<3>" … "<7>": sd-daemon(3) priority prefixes.
class SyslogPriorityFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    int prio = 6;
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug: prio = 7; break;
      case spdlog::level::info: prio = 6; break;
      case spdlog::level::warn: prio = 4; break;
      case spdlog::level::err: prio = 3; break;
      case spdlog::level::critical: prio = 2; break;
      default: break;
    }
    const char s[4] = {'<', static_cast<char>('0' + prio), '>', '\0'};
    dest.append(s, s + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<SyslogPriorityFlag>(); }
};

}  // namespace

void init_logging(std::string_view program, std::string_view level) {
  auto logger = std::make_shared<spdlog::logger>(std::string(program), std::make_shared<spdlog::sinks::stderr_sink_mt>());
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  // JOURNAL_STREAM is how systemd tells a service its stderr is the journal
  // (systemd.exec(5)); it is a protocol, not configuration.
  if (std::getenv("JOURNAL_STREAM") != nullptr) {
    formatter->add_flag<SyslogPriorityFlag>('*').set_pattern("%*%v");
  } else {
    formatter->set_pattern("%Y-%m-%d %H:%M:%S.%e %n[%P] %^%l%$: %v");
  }
  logger->set_formatter(std::move(formatter));
  auto lvl = spdlog::level::from_str(std::string(level == "warning" ? "warn" : level));
  if (lvl == spdlog::level::off) lvl = spdlog::level::info;
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace airs
