#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/spdx_test.sh: fails on a source file without its licence line (LICENSE: Apache-2.0). Every
# C++ and CUDA source and header, CMakeLists.txt, shell script, Python source and stub, sanitizer
# suppression and fuzzing dictionary that git tracks names the licence in its first two lines, as
# "SPDX-License-Identifier: Apache-2.0" in a comment. Test data (tests/data/) is left out.
#
# Usage: tests/spdx_test.sh [source root]   (default: the repository this script is in)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
if ! git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  echo "spdx_test: $root is not a git work tree; nothing to check"
  exit 0
fi
[[ -f LICENSE ]] || { echo "spdx_test: no LICENSE file in $root"; exit 1; }
missing=0
while IFS= read -r f; do
  [[ -f "$f" ]] || continue
  if ! head -n 2 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0'; then
    echo "$f: no 'SPDX-License-Identifier: Apache-2.0' in its first two lines"
    missing=$((missing + 1))
  fi
done < <(git ls-files -- '*.cc' '*.h' '*.cu' '*CMakeLists.txt' '*.sh' '*.py' '*.pyi' '.ci/run' \
           '*.supp' '*.dict' \
           | grep -v '^tests/data/')
if (( missing > 0 )); then
  echo "spdx_test: $missing file(s) without the licence line"
  exit 1
fi
echo "spdx_test: every source file names its licence"
