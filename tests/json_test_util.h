// SPDX-License-Identifier: Apache-2.0
// tests/json_test_util.h: reading the numbers of a program's --json in the benchmarks' tests.
#ifndef CKV_TESTS_JSON_TEST_UTIL_H_
#define CKV_TESTS_JSON_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <string_view>

#include "gtest/gtest.h"
#include "tools/json_reader.h"

namespace ckv::testing {

// The number at `key` of a JSON object (an integer or a double). NaN, and a test failure naming
// the key, when it is missing or not a number (NaN fails every comparison, so a check on it
// cannot pass by accident).
inline double JsonNumber(const tools::JsonValue& v, std::string_view key) {
  const tools::JsonValue* x = v.Find(key);
  if (x == nullptr) {
    ADD_FAILURE() << "missing key " << key;
    return NAN;
  }
  if (x->AsInt() != nullptr) return static_cast<double>(*x->AsInt());
  if (x->AsDouble() != nullptr) return *x->AsDouble();
  ADD_FAILURE() << key << " is a " << x->TypeName() << ", not a number";
  return NAN;
}

// The integer at `key` of a JSON object; -1 when it is missing or not an integer (the counts
// the tests read are never negative, so -1 fails any check of one).
inline int64_t JsonInt(const tools::JsonValue& v, std::string_view key) {
  const tools::JsonValue* x = v.Find(key);
  return x != nullptr && x->AsInt() != nullptr ? *x->AsInt() : -1;
}

}  // namespace ckv::testing

#endif  // CKV_TESTS_JSON_TEST_UTIL_H_
