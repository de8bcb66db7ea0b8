// SPDX-License-Identifier: Apache-2.0
// tools/cli.h: the one command-line parser of kvctl and the benchmarks.
//
// Every program of tools/ and bench/ parses its flags with CLI11 configured through this file,
// so that they agree on:
//   --help, -h      the program's (or kvctl command's) help on stdout, exit 0;
//   --version       "PROGRAM (ckv VERSION)" on stdout, exit 0;
//   --json [PATH]   machine-readable output: one JSON object. Without PATH (or with PATH "-") it
//                   goes to stdout in place of the table or text; with PATH it is written to
//                   PATH and the table still goes to stdout. A PATH is taken only when it is not
//                   needed as a required positional argument: 'kvctl ls --json STORE' lists
//                   STORE as JSON on stdout;
//   usage errors    "PROGRAM: MESSAGE" and "Run 'PROGRAM --help' for usage." on stderr, exit 2;
//   numbers         decimal integers without sign, byte counts with K/M/G/T suffixes (powers of
//                   1024), each rejected with a message that names the flag and the value.
//
//   CLI::App app{"Times Engine::Put of one prefix.", "put_bench"};
//   cli::Configure(app);
//   cli::AddUint(app, "--tokens", &flags.tokens, "prefix length");
//   cli::JsonOutput json;
//   cli::AddJson(app, &json);
//   if (const std::optional<int> exit = cli::Parse(app, argc, argv)) return *exit;
//
// Thread-safety: none; parse on one thread before starting others.
#ifndef CKV_TOOLS_CLI_H_
#define CKV_TOOLS_CLI_H_

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ckv::cli {

// Exit codes every program uses for these cases.
inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitError = 3;

// A decimal integer in [0, 2^64): digits only (no sign, space or trailing text), no overflow.
bool ParseUint(std::string_view text, uint64_t* out);
// A byte count: a decimal integer, optionally followed by K, M, G or T (powers of 1024, either
// case), optionally followed by "B" or "iB": 4096, 64K, 2GiB, 1T. No overflow.
bool ParseBytes(std::string_view text, uint64_t* out);
// A finite decimal floating-point number, the whole of `text`.
bool ParseDouble(std::string_view text, double* out);

// Gives `app` (made as CLI::App{description, program}) the common flags (--help, --version) and
// the common help layout; `footer` (optional) is printed after the options.
void Configure(CLI::App& app, const std::string& footer = "");

// Parses argv. Returns std::nullopt when the program should go on; else the exit code, after
// printing the help or version (0) or the usage error (kExitUsage) as the banner says.
std::optional<int> Parse(CLI::App& app, int argc, char** argv);
// Same for arguments already split (kvctl: after its command name).
std::optional<int> Parse(CLI::App& app, std::vector<std::string> args);

// The main() of a program whose flags `parse` reads into a Flags (returning an exit code when
// the program should stop there: --help, a usage error) and that `run` then runs.
template <typename Flags>
int Main(int argc, char** argv, std::optional<int> (*parse)(int, char**, Flags*),
         int (*run)(const Flags&)) {
  Flags flags;
  if (const std::optional<int> exit = parse(argc, argv, &flags)) return *exit;
  return run(flags);
}

// Prints "PROGRAM: MESSAGE" and the --help hint to stderr; returns kExitUsage. `command` is the
// name shown in the hint ("kvctl put"); empty: the hint names `program` alone.
int UsageError(std::string_view program, std::string_view message, std::string_view command = "");

// An option whose value is checked by `parse`; a value it rejects is a usage error
// "NAME: 'VALUE' is not WHAT". `type_name` is the value's name in --help ("N", "BYTES").
CLI::Option* AddParsed(CLI::App& app, const std::string& name, const std::string& help,
                       const std::string& type_name, const std::string& what,
                       std::function<bool(const std::string&)> parse);

// Unsigned integers (decimal digits only), with the range of T.
template <typename T>
CLI::Option* AddUint(CLI::App& app, const std::string& name, T* out, const std::string& help,
                     const std::string& type_name = "N") {
  static_assert(std::is_unsigned_v<T>);
  const std::string what =
      std::numeric_limits<T>::max() == std::numeric_limits<uint64_t>::max()
          ? std::string("a non-negative integer")
          : "an integer in 0.." + std::to_string(std::numeric_limits<T>::max());
  return AddParsed(app, name, help, type_name, what, [out](const std::string& text) {
    uint64_t v = 0;
    if (!ParseUint(text, &v) || v > std::numeric_limits<T>::max()) return false;
    *out = static_cast<T>(v);
    return true;
  });
}
// A byte count (see ParseBytes).
CLI::Option* AddBytes(CLI::App& app, const std::string& name, uint64_t* out,
                      const std::string& help);
// A number (see ParseDouble).
CLI::Option* AddDouble(CLI::App& app, const std::string& name, double* out, const std::string& help,
                       const std::string& type_name = "X");
// One of `choices`: "NAME: 'VALUE' is not a, b or c".
CLI::Option* AddChoice(CLI::App& app, const std::string& name, std::string* out,
                       const std::vector<std::string>& choices, const std::string& help);

// --layers all|N, as the analysis benchmarks take it: 0 (all, the default) or the first N layers.
CLI::Option* AddLayerCount(CLI::App& app, uint32_t* layers);

// The destination of --json [PATH] (see the banner).
struct JsonOutput {
  bool enabled = false;  // --json given
  std::string path;      // "" or "-": stdout

  // True when the JSON takes the place of the table on stdout.
  bool ToStdout() const { return enabled && (path.empty() || path == "-"); }
  // Writes `json` and a newline to stdout or PATH. PATH is replaced whole, as
  // tools/output_file.h says (a new file is mode 0600; a link at PATH is replaced, not
  // followed). Errors name PATH.
  absl::Status Write(std::string_view json) const;
};
CLI::Option* AddJson(CLI::App& app, JsonOutput* out);

}  // namespace ckv::cli

#endif  // CKV_TOOLS_CLI_H_
