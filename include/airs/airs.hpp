// SPDX-License-Identifier: Apache-2.0
// A thin C++ wrapper over the C API: RAII owners that close what they open,
// errors as airs::ClientError (what() is airs_last_error()).
#pragma once

// std::span in the interface: C++20. (The C header, airs/airs.h, compiles
// as C99, C11, C++17 and C++20; tests/unit/header.)
#if defined(_MSVC_LANG) ? _MSVC_LANG < 202002L : __cplusplus < 202002L
#error "airs/airs.hpp needs C++20 (-std=c++20); from C or C++17 use airs/airs.h"
#endif

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "airs/airs.h"

namespace airs {

class ClientError : public std::runtime_error {
 public:
  ClientError(int code, const std::string& what) : std::runtime_error(what), code_(code) {}
  [[nodiscard]] int code() const noexcept { return code_; }  // negative errno

 private:
  int code_;
};

namespace detail {
inline int check(int rc) {
  if (rc < 0) throw ClientError(rc, airs_last_error());
  return rc;
}
}  // namespace detail

class Client {
 public:
  explicit Client(const char* bus = nullptr) { detail::check(airs_connect(bus, &c_)); }
  ~Client() { airs_disconnect(c_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  [[nodiscard]] airs_client* get() const { return c_; }

 private:
  airs_client* c_ = nullptr;
};

class Model {
 public:
  Model(Client& c, const std::string& path, const char* name = nullptr) {
    airs_model_options o{name, 0, 0, 0};
    detail::check(airs_model_open(c.get(), path.c_str(), &o, &m_));
  }
  ~Model() { airs_model_close(m_); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  [[nodiscard]] std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(airs_model_data(m_)), static_cast<size_t>(airs_model_size(m_))};
  }
  [[nodiscard]] bool resident() const { return airs_model_is_resident(m_) == 1; }
  void wait_resident(int timeout_ms = -1) { detail::check(airs_model_wait_resident(m_, timeout_ms)); }
  [[nodiscard]] bool takes_hints() const { return airs_model_takes_hints(m_) == 1; }
  // airs_model_hint_experts: false when the hint was not sent (dropped: a
  // full socket, or a model that takes none); never throws, never blocks.
  bool hint_experts(uint32_t layer, std::span<const uint32_t> experts) noexcept {
    return airs_model_hint_experts(m_, layer, experts.data(), experts.size()) == 0;
  }
  // airs_model_predict_experts: the same, for a guess.
  bool predict_experts(uint32_t layer, std::span<const uint32_t> experts) noexcept {
    return airs_model_predict_experts(m_, layer, experts.data(), experts.size()) == 0;
  }
  [[nodiscard]] airs_model* get() const { return m_; }

 private:
  airs_model* m_ = nullptr;
};

class Session {
 public:
  Session(Client& c, Model& m, airs_priority p) { detail::check(airs_session_create(c.get(), m.get(), p, &s_)); }
  ~Session() { airs_session_close(s_); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  [[nodiscard]] airs_kv_geometry geometry() const {
    airs_kv_geometry g{};
    detail::check(airs_session_geometry(s_, &g));
    return g;
  }
  [[nodiscard]] std::string_view kv_type() const { return airs_session_kv_type(s_); }
  std::vector<uint32_t> allocate(uint32_t n) {
    std::vector<uint32_t> b(n);
    detail::check(airs_session_allocate(s_, n, b.data()));
    return b;
  }
  void free(std::span<const uint32_t> b) { detail::check(airs_session_free(s_, b.data(), b.size())); }
  void commit(std::span<const uint32_t> b, std::span<const uint64_t> h) {
    detail::check(airs_session_commit(s_, b.data(), h.data(), std::min(b.size(), h.size())));
  }
  std::vector<uint32_t> match_prefix(std::span<const uint64_t> h) {
    std::vector<uint32_t> b(h.size());
    b.resize(static_cast<size_t>(detail::check(airs_session_match_prefix(s_, h.data(), h.size(), b.data()))));
    return b;
  }
  uint32_t prepare_write(uint32_t block) {
    uint32_t w = 0;
    detail::check(airs_session_prepare_write(s_, block, &w));
    return w;
  }
  void set_length(uint32_t tokens) { detail::check(airs_session_set_length(s_, tokens)); }
  [[nodiscard]] void* block(uint32_t id) const { return airs_session_block_ptr(s_, id); }
  [[nodiscard]] int notice_fd() const { return airs_session_notice_fd(s_); }
  [[nodiscard]] airs_session* get() const { return s_; }

 private:
  airs_session* s_ = nullptr;
};

}  // namespace airs
