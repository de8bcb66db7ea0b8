#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/format.sh: formats ckv's C++ and CUDA files with clang-format and the repository's
# .clang-format (Google's style at 100 columns).
#
#   tools/format.sh           rewrite every tracked file in place
#   tools/format.sh --check   list the files clang-format would change; exit 1 if any
#   tools/format.sh FILE...   rewrite only these files
#
# Left alone: third_party/ and tests/data/ (fixtures kept byte for byte).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null 2>&1 ||
  { echo "format.sh: clang-format is not installed (Debian package clang-format)" >&2; exit 2; }
check=0
if [[ "${1:-}" == --check ]]; then check=1; shift; fi
files=("$@")
if ((${#files[@]} == 0)); then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^third_party/\|^tests/data/')
fi
if ((check)); then
  changed=0
  for f in "${files[@]}"; do
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then echo "$f"; changed=1; fi
  done
  exit "$changed"
fi
clang-format --style=file -i "${files[@]}"
