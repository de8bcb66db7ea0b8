// SPDX-License-Identifier: Apache-2.0
// AlignedBuffer (see io/file_system.h): heap memory aligned for direct I/O.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/assert.h"
#include "io/file_system.h"

namespace ckv::io {
namespace {

constexpr size_t kMinMemoryAlignment = 4096;

}  // namespace

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(size_t size, size_t alignment) {
  // posix_memalign needs a power of two that is a multiple of sizeof(void*). Direct I/O
  // alignments are powers of two; anything else is raised to the next one (and small ones to
  // sizeof(void*)), which is a multiple of every power of two below it.
  alignment = std::bit_ceil(std::max(alignment, sizeof(void*)));
  AlignedBuffer buffer;
  if (size == 0) return buffer;
  const auto exhausted = [&] {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate an aligned buffer of ", size,
                                                     " bytes (alignment ", alignment, ")"));
  };
  // Rounded up so that the whole buffer can be the length of a direct I/O.
  if (size > SIZE_MAX - (alignment - 1)) return exhausted();
  const size_t rounded = (size + alignment - 1) & ~(alignment - 1);
  void* memory = nullptr;
  // The memory itself starts on a page (4 KiB) boundary at least, whatever `alignment` allows:
  // ext4 treats a direct write whose buffer is not aligned to its block size as unaligned, takes
  // the inode lock exclusively and waits for every direct I/O in flight, so a file system that
  // reports a 512-byte alignment would get its writes one at a time.
  if (posix_memalign(&memory, std::max(alignment, kMinMemoryAlignment), rounded) != 0) {
    return exhausted();
  }
  buffer.data_ = static_cast<std::byte*>(memory);
  buffer.size_ = rounded;
  return buffer;
}

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment) {
  absl::StatusOr<AlignedBuffer> buffer = Allocate(size, alignment);
  CKV_CHECK(buffer.ok());
  *this = std::move(*buffer);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace ckv::io
