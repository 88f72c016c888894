// SPDX-License-Identifier: Apache-2.0
// Which sanitizer this translation unit is built with, under GCC and Clang
// alike: GCC defines __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__, Clang 14
// defines neither and answers __has_feature instead. AIRS_ASAN and
// AIRS_TSAN are defined (as 1) when the sanitizer is on.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define AIRS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AIRS_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define AIRS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define AIRS_TSAN 1
#endif
#endif
