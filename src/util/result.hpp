// SPDX-License-Identifier: Apache-2.0
// Result<T>: a value or an error, for the edges where failure is expected
// (syscalls, parsing, requests from clients). Exceptions are used only at
// start-up and to raise named D-Bus errors; everything below returns Result.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace airs {

// What went wrong, in words a user can act on. `code` is a positive errno
// value where one applies (ENOMEM, EINVAL, ...) so callers can branch on it;
// `message` names the object and the failure ("model 'x': pool exhausted:
// need 12 pages of 2 MiB, 3 free").
struct Error {
  int code = EINVAL;
  std::string message;
};

template <typename... Args>
[[nodiscard]] Error make_error(int code, fmt::format_string<Args...> f, Args&&... args) {
  return Error{code, fmt::format(f, std::forward<Args>(args)...)};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}        // NOLINT: implicit by design

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }

  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const Error& error() const& { return err_; }
  Error&& error() && { return std::move(err_); }

 private:
  Error err_{};
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace airs

// Propagate an error from an expression returning Result<...>.
#define AIRS_TRY(expr)                                  \
  do {                                                  \
    auto airs_try_r_ = (expr);                          \
    if (!airs_try_r_.ok()) return std::move(airs_try_r_).error(); \
  } while (0)
