// SPDX-License-Identifier: Apache-2.0
// tests/shaped_spec.h: a ModelSpec of a given shape, for the tests that want a small or an odd
// one rather than a preset (ModelSpec::Preset). Free of GoogleTest, so that the crash test's
// child program may use it too.
#ifndef CKV_TESTS_SHAPED_SPEC_H_
#define CKV_TESTS_SHAPED_SPEC_H_

#include <cstdint>
#include <string>
#include <utility>

#include "ckv/model_spec.h"

namespace ckv::testing {

// `layers` layers of `q_heads` query and `kv_heads` KV heads of `head_dim`, chunks of
// `chunk_tokens` tokens, in `dtype`, named `model_id` (which goes into the fingerprint).
inline ModelSpec ShapedSpec(std::string model_id, uint32_t layers, uint32_t q_heads,
                            uint32_t kv_heads, uint32_t head_dim, uint32_t chunk_tokens = 16,
                            DType dtype = DType::kFp16) {
  ModelSpec spec;
  spec.model_id = std::move(model_id);
  spec.layers = layers;
  spec.q_heads = q_heads;
  spec.kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.chunk_tokens = chunk_tokens;
  spec.dtype = dtype;
  return spec;
}

}  // namespace ckv::testing

#endif  // CKV_TESTS_SHAPED_SPEC_H_
