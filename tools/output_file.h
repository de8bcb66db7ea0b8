// SPDX-License-Identifier: Apache-2.0
// tools/output_file.h: how kvctl and the tools write a file the user named (kvctl export's
// OUT.safetensors, --json PATH): whole or not at all, and never through a planted link.
//
// WriteOutputFile(path, produce):
//   1. creates a temporary file in path's directory, ".NAME.XXXXXXXXXXXXXXXX.tmp" with 16 random
//      hex digits, by open(O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600): a name already
//      taken (by a file or by a symbolic link planted there) is never opened, another random
//      name is tried (kMaxTempAttempts in all), so a link cannot redirect the write and a
//      planted file is never truncated;
//   2. calls produce(write), which hands the file's bytes to `write` in order;
//   3. fsyncs the file, renames it over `path` (a link at `path` is replaced, not followed),
//      and fsyncs the directory, so that `path` is either as it was or the complete new file;
//   4. on any error of these steps, or from produce, removes the temporary file and returns the
//      first error, naming the path.
// The file is mode 0600 (less where the umask says), as the store's files are: an exported
// prefix is the store's data.
//
// Two exceptions, where nothing is created or renamed:
//   - `path` is itself (lstat: not through a link) a character device or a FIFO (/dev/null, a
//     named pipe): the bytes are written to it in place, opened with O_NOFOLLOW and O_NONBLOCK
//     (cleared once open) and without O_CREAT or O_TRUNC. A FIFO that no process reads is
//     FailedPrecondition, not a wait; a regular file or link found at the open is refused. A
//     link to a device or FIFO is replaced by the file, as any link at `path` is.
//   - `path` is /dev/stdout, /dev/stderr, /proc/self/fd/N or /dev/fd/N (a stream the shell
//     handed over, as with >(...)): the bytes go to that descriptor of this process, duplicated,
//     whatever it is open to.
//
// Thread-safety: reentrant.
#ifndef CKV_TOOLS_OUTPUT_FILE_H_
#define CKV_TOOLS_OUTPUT_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ckv::tools {

// Appends bytes to the file being written. Errors: the mapped write error.
using OutputWriteFn = std::function<absl::Status(std::span<const std::byte> bytes)>;

struct OutputFileOptions {
  // The 16 hex digits of the next temporary name to try. Default (empty): random (getrandom).
  // Tests set it to make the names guessable.
  std::function<std::string()> temp_suffix;
};

// How many temporary names WriteOutputFile tries before giving up (AlreadyExists).
inline constexpr int kMaxTempAttempts = 16;

// Writes the bytes `produce` hands over to `path`, as the banner says. Errors: the mapped
// create / write / fsync / rename error naming the file; AlreadyExists when kMaxTempAttempts
// temporary names are all taken; produce's own error. On error no temporary file is left.
absl::Status WriteOutputFile(const std::string& path,
                             const std::function<absl::Status(const OutputWriteFn& write)>& produce,
                             const OutputFileOptions& options = {});
// The same, for bytes already in memory.
absl::Status WriteOutputFile(const std::string& path, std::string_view contents,
                             const OutputFileOptions& options = {});

}  // namespace ckv::tools

#endif  // CKV_TOOLS_OUTPUT_FILE_H_
