// SPDX-License-Identifier: Apache-2.0
// io/io_op_narrow.h: part of an IoOp, for a layer that splits a transfer (the
// fault-injecting wrapper's short and torn transfers).
//
// Thread-safety: a pure function.
#ifndef CKV_IO_IO_OP_NARROW_H_
#define CKV_IO_IO_OP_NARROW_H_

#include <algorithm>
#include <cstddef>
#include <vector>

#include "io/file_system.h"

namespace ckv::io {

// `op` narrowed to its bytes [from, from + length): the offset and buffer advance; a gathered
// op's pieces are cut to fit into *pieces, which the result points into (keep it alive while the
// narrowed op is in flight). REQUIRES: from + length <= op.length.
inline IoOp NarrowIoOp(const IoOp& op, size_t from, size_t length, std::vector<IoPiece>* pieces) {
  IoOp out = op;
  out.offset += from;
  out.length = length;
  if (op.gather.empty()) {
    if (out.buffer != nullptr) out.buffer += from;
    return out;
  }
  pieces->clear();
  size_t skip = from;
  size_t left = length;
  for (const IoPiece& piece : op.gather) {
    if (left == 0) break;
    if (skip >= piece.length) {
      skip -= piece.length;
      continue;
    }
    const size_t take = std::min(piece.length - skip, left);
    pieces->push_back(IoPiece{piece.data + skip, take});
    left -= take;
    skip = 0;
  }
  out.gather = *pieces;
  return out;
}

}  // namespace ckv::io

#endif  // CKV_IO_IO_OP_NARROW_H_
