// SPDX-License-Identifier: Apache-2.0
// ckv/io_backend.h: which backend performs disk I/O, the one definition that the public options,
// the I/O layer (io/file_system.h), the read engine and the engine all use.
//
// Thread-safety: plain values.
#ifndef CKV_IO_BACKEND_H_
#define CKV_IO_BACKEND_H_

#include <cstdint>

namespace ckv {

// Which backend writes and reads segment data.
enum class IoBackend : uint8_t {
  kAuto = 0,     // io_uring when the kernel allows it, else kThreads (logged once).
  kUring = 1,    // io_uring; Open fails with Unavailable when it cannot be set up.
  kThreads = 2,  // positioned pread/pwrite on a pool of threads; no io_uring.
};

// "auto", "io_uring" or "threads".
inline const char* IoBackendName(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "io_uring";
    case IoBackend::kThreads:
      return "threads";
  }
  return "?";
}

}  // namespace ckv

#endif  // CKV_IO_BACKEND_H_
