#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/thread_safety.sh: clang's thread-safety analysis over every C++ file of ckv.
#
# The code annotates its locks and what they guard (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED,
# ...; absl::Mutex is itself annotated), but g++, which builds the project, ignores those
# annotations: only clang checks them. This script parses each translation unit of a configured
# build with clang++ -fsyntax-only -Wthread-safety -Werror, so that an access to a guarded member
# without its lock, or a call to a function that needs a lock without it, fails here. Nothing is
# compiled to an object, so it costs a parse of each file (tools/ckv.sh test runs it on build/).
#
# What is checked: each entry of BUILD_DIR/compile_commands.json (written by every configure, see
# CMakeLists.txt) whose file lies in the repository, outside any build directory, and is C++ (.cc,
# .cpp, .cxx); the CUDA files (.cu) are left out (nvcc compiles them, and clang would need the
# CUDA toolchain to parse them). Of each entry's command only what decides how the file parses is
# kept (-I, -isystem, -iquote, -include, -D, -U, -std=): the rest is g++'s (its warnings, -O, -flto,
# -fno-fat-lto-objects, ...), which clang need not see and may not know. Only -Wthread-safety is
# enabled (-Wno-everything first turns off clang's warnings that are on by default): the other
# warnings are g++'s business in this project (-Wall -Wextra there), and enabling them here would
# fail the check on matters that are not thread safety. A file clang cannot parse fails too (its
# errors are shown), so that no file goes unchecked. -Wthread-safety-beta, clang's experimental
# part of the analysis, is not enabled; it had nothing to say when this check was added
# (CKV_TSA_FLAGS=-Wthread-safety-beta tries it).
#
# Usage: tools/thread_safety.sh [BUILD_DIR]     (default: <repo>/build)
# Environment:
#   CKV_TSA_CXX    the clang++ to use (default: clang++, else clang++-14)
#   CKV_TSA_JOBS   parallel parses (default 2)
#   CKV_TSA_FLAGS  more clang flags, after the script's (e.g. -Wthread-safety-beta)
#   CKV_TSA_ONLY   a (Python) regular expression: check only the files whose path (relative to
#                  the repository) it matches, e.g. '^storage/' (default: all)
# Exit status: 0 when no file has a diagnostic; 1 when any has (each named, with its diagnostics);
# 2 when clang++ or compile_commands.json is missing or the arguments are wrong.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_ROOT
readonly JOBS="${CKV_TSA_JOBS:-2}"

say() { printf 'thread_safety: %s\n' "$*" >&2; }

(($# <= 1)) || { printf 'usage: %s [BUILD_DIR]\n' "$0" >&2; exit 2; }
build_dir="$(cd "${1:-$REPO_ROOT/build}" 2>/dev/null && pwd)" ||
  { say "no build directory ${1:-$REPO_ROOT/build} (configure one with cmake first)"; exit 2; }
readonly db="$build_dir/compile_commands.json"
[[ -f "$db" ]] || { say "no $db (configure $build_dir with cmake first)"; exit 2; }

cxx="${CKV_TSA_CXX:-}"
if [[ -z "$cxx" ]]; then
  for c in clang++ clang++-14; do
    if command -v "$c" >/dev/null 2>&1; then cxx="$c"; break; fi
  done
fi
if [[ -z "$cxx" ]] || ! command -v "$cxx" >/dev/null 2>&1; then
  say "clang++ not found (Debian package clang); set CKV_TSA_CXX to choose one"
  exit 2
fi

start_ns="$(date +%s%N)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ckv-thread-safety.XXXXXX")"
trap 'rm -rf -- "$tmp"' EXIT

# One clang response file per translation unit ($tmp/NNNN.rsp, GNU quoting); its source file's
# path goes to $tmp/NNNN.src. Python reads the JSON and splits each command as the shell would.
python3 - "$db" "$REPO_ROOT" "$tmp" "${CKV_TSA_ONLY:-}" <<'EOF'
import json, os, re, shlex, sys

db, root, tmp, only = sys.argv[1:5]
root = os.path.realpath(root)
# The options that decide how a file parses; those taking a value may have it joined or next.
WITH_VALUE = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-D", "-U")
n = 0
pchs = {}  # (cmake_pch.hxx, flags) -> the clang precompiled header made of it
UNITY = re.compile(r"unity_[0-9]+_cxx\.cxx$")
for entry in json.load(open(db)):
    src = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(src, root)
    members = [rel]
    if UNITY.search(src) and os.path.basename(os.path.dirname(src)) == "Unity":
        # A unity bundle (CKV_UNITY_BUILD): generated, but only a list of the repository's
        # sources, each #included whole; it is checked as g++ compiles it, named by its members.
        members = [os.path.relpath(m, root) for m in
                   re.findall(r'^#include "([^"]+)"', open(src).read(), re.M)]
        rel = " + ".join(members)
    elif rel.startswith("..") or rel.split(os.sep)[0].startswith("build"):
        continue  # third-party or generated
    elif os.path.splitext(src)[1] not in (".cc", ".cpp", ".cxx"):
        continue  # .cu: nvcc's
    if only and not any(re.search(only, m) for m in members):
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    kept, i = [], 1
    while i < len(args):
        a = args[i]
        if a in WITH_VALUE and i + 1 < len(args):
            kept += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith("-std=") or any(a.startswith(p) and len(a) > len(p) for p in WITH_VALUE):
            if a.startswith("-isystem="):  # nvcc's spelling; clang wants it apart
                kept += ["-isystem", a[len("-isystem="):]]
            else:
                kept.append(a)
        i += 1
    # A header CMake precompiles for g++ (target_precompile_headers) is forced in by -include of
    # its cmake_pch.hxx, beside which g++'s .gch lies, which clang cannot read: clang gets a
    # precompiled header of its own, made once per header and set of flags (pchNN.rsp, made
    # before the files that use it), in place of parsing the header again for each file.
    for j in range(len(kept) - 1):
        if kept[j] == "-include" and kept[j + 1].endswith("cmake_pch.hxx"):
            flags = kept[:j] + kept[j + 2:]
            key = (kept[j + 1], tuple(flags))
            if key not in pchs:
                pch = os.path.join(tmp, "pch%02d.pch" % len(pchs))
                with open(os.path.join(tmp, "pch%02d.rsp" % len(pchs)), "w") as f:
                    f.write("\n".join(shlex.quote(a) for a in flags + [
                        "-x", "c++-header", kept[j + 1], "-o", pch]) + "\n")
                with open(os.path.join(tmp, "pch%02d.src" % len(pchs)), "w") as f:
                    f.write(os.path.relpath(kept[j + 1], root) + " (precompiled for clang)\n")
                pchs[key] = pch
            kept = kept[:j] + ["-include-pch", pchs[key]] + kept[j + 2:]
            break
    kept.append(src)
    with open(os.path.join(tmp, "%04d.rsp" % n), "w") as f:
        f.write("\n".join(shlex.quote(a) for a in kept) + "\n")
    with open(os.path.join(tmp, "%04d.src" % n), "w") as f:
        f.write(rel + "\n")
    n += 1
if n == 0:
    print("thread_safety: no C++ files of the repository to check in " + db, file=sys.stderr)
    sys.exit(2)
EOF

# check_one RSP: parses one file (or, for pchNN.rsp, precompiles a header for clang: the analysis
# of the header's own code happens there, once); its diagnostics go to RSP.log, and RSP.failed
# marks a failure.
check_one() {
  local rsp="$1" extra=() mode=(-fsyntax-only)
  if [[ -n "${CKV_TSA_FLAGS:-}" ]]; then read -r -a extra <<<"$CKV_TSA_FLAGS"; fi
  if [[ "$(basename "$rsp")" == pch* ]]; then mode=(); fi
  if ! "$CKV_TSA_CXX_RESOLVED" "${mode[@]}" -Wno-everything -Wthread-safety -Werror \
    -Wno-unknown-warning-option "${extra[@]}" "@$rsp" >"${rsp%.rsp}.log" 2>&1 ||
    [[ -s "${rsp%.rsp}.log" ]]; then
    touch "${rsp%.rsp}.failed"
  fi
}
export -f check_one
export CKV_TSA_CXX_RESOLVED="$cxx"

# The precompiled headers first, then the files (those of a header that failed fail with it).
mapfile -t pch_rsps < <(find "$tmp" -name 'pch*.rsp' | sort)
mapfile -t tu_rsps < <(find "$tmp" -name '[0-9]*.rsp' | sort)
rsps=("${pch_rsps[@]}" "${tu_rsps[@]}")
# shellcheck disable=SC2016  # $1 is the child shell's, in single quotes on purpose
for batch in pch tu; do
  if [[ "$batch" == pch ]]; then set -- "${pch_rsps[@]}"; else set -- "${tu_rsps[@]}"; fi
  (($# > 0)) || continue
  printf '%s\0' "$@" | xargs -0 -n1 -P"$JOBS" bash -c 'check_one "$1"' _
done

failed=0
for rsp in "${rsps[@]}"; do
  base="${rsp%.rsp}"
  if [[ -e "$base.failed" ]]; then
    failed=$((failed + 1))
    printf '\n==> %s\n' "$(cat "$base.src")" >&2
    cat "$base.log" >&2
  fi
done
secs="$(awk -v ns="$(($(date +%s%N) - start_ns))" 'BEGIN { printf "%.1f", ns / 1e9 }')"
if ((failed > 0)); then
  say "FAILED: $failed of ${#tu_rsps[@]} translation units and ${#pch_rsps[@]} precompiled" \
    "headers have diagnostics (above)" \
    "($("$cxx" --version | head -n1), ${secs} s)"
  exit 1
fi
say "${#tu_rsps[@]} translation units checked (${#pch_rsps[@]} precompiled headers)," \
  "no thread-safety diagnostics" \
  "($("$cxx" --version | head -n1), ${secs} s)"
