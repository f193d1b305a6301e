// Fray: the error side of the JIT entry-point contract (launch_abi.h): a JIT-compiled shared
// object reports a failure as a printf-formatted message into the caller's buffer, never by
// throwing across the library boundary.
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

namespace fray {

inline void jit_set_err(char* err, int32_t err_len, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
inline void jit_set_err(char* err, int32_t err_len, const char* fmt, ...) {
  if (err == nullptr || err_len <= 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, static_cast<size_t>(err_len), fmt, ap);
  va_end(ap);
}

}  // namespace fray
