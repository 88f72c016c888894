// SPDX-License-Identifier: Apache-2.0
// Bus names, object paths and error names of interface version 1.
#pragma once

namespace airs::dbus {

inline constexpr const char* kBusName = "org.aios.Airs1";
inline constexpr const char* kManagerPath = "/org/aios/Airs1";
inline constexpr const char* kModelPathPrefix = "/org/aios/Airs1/model/";
inline constexpr const char* kSessionPathPrefix = "/org/aios/Airs1/session/";

inline constexpr const char* kErrInvalidArgument = "org.aios.Airs1.Error.InvalidArgument";
inline constexpr const char* kErrBadModel = "org.aios.Airs1.Error.BadModel";
inline constexpr const char* kErrPoolExhausted = "org.aios.Airs1.Error.PoolExhausted";
inline constexpr const char* kErrQuotaExceeded = "org.aios.Airs1.Error.QuotaExceeded";
inline constexpr const char* kErrNotFound = "org.aios.Airs1.Error.NotFound";
inline constexpr const char* kErrBusy = "org.aios.Airs1.Error.Busy";
inline constexpr const char* kErrUnsupported = "org.aios.Airs1.Error.Unsupported";
inline constexpr const char* kErrFailed = "org.aios.Airs1.Error.Failed";
inline constexpr const char* kErrAccessDenied = "org.freedesktop.DBus.Error.AccessDenied";
inline constexpr const char* kErrUnknownObject = "org.freedesktop.DBus.Error.UnknownObject";

}  // namespace airs::dbus
