// SPDX-License-Identifier: Apache-2.0
// AlignedBuffer (see io/file_system.h): heap memory aligned for direct I/O.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include "io/file_system.h"

namespace ckv::io {
namespace {

constexpr size_t kMinMemoryAlignment = 4096;

}  // namespace

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment) {
  // posix_memalign needs a power of two that is a multiple of sizeof(void*). Direct I/O
  // alignments are powers of two; anything else is raised to the next one (and small ones to
  // sizeof(void*)), which is a multiple of every power of two below it.
  alignment = std::bit_ceil(std::max(alignment, sizeof(void*)));
  if (size == 0) return;
  // Rounded up so that the whole buffer can be the length of a direct I/O.
  if (size > SIZE_MAX - (alignment - 1)) throw std::bad_alloc();
  const size_t rounded = (size + alignment - 1) & ~(alignment - 1);
  void* memory = nullptr;
  // Like operator new, running out of memory is not a Status: nothing sensible can follow it.
  // The memory itself starts on a page (4 KiB) boundary at least, whatever `alignment` allows:
  // ext4 treats a direct write whose buffer is not aligned to its block size as unaligned, takes
  // the inode lock exclusively and waits for every direct I/O in flight, so a file system that
  // reports a 512-byte alignment would get its writes one at a time.
  if (posix_memalign(&memory, std::max(alignment, kMinMemoryAlignment), rounded) != 0) {
    throw std::bad_alloc();
  }
  data_ = static_cast<std::byte*>(memory);
  size_ = rounded;
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
