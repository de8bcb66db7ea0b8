// SPDX-License-Identifier: Apache-2.0
#include "tools/cli.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "ckv/log.h"
#include "ckv/status.h"
#include "tools/output_file.h"

#ifndef CKV_VERSION
#define CKV_VERSION "unknown"
#endif

namespace ckv::cli {

bool ParseUint(std::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return false;
  *out = value;
  return true;
}

bool ParseBytes(std::string_view text, uint64_t* out) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  uint64_t value = 0;
  if (!ParseUint(text.substr(0, digits), &value)) return false;
  std::string_view suffix = text.substr(digits);
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      case 't':
      case 'T':
        shift = 40;
        break;
      default:
        return false;
    }
    suffix.remove_prefix(1);
    if (!suffix.empty() && suffix != "B" && suffix != "iB") return false;
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) return false;
  *out = value << shift;
  return true;
}

bool ParseDouble(std::string_view text, double* out) {
  if (text.empty()) return false;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return false;
  }
  *out = value;
  return true;
}

void Configure(CLI::App& app, const std::string& footer) {
  app.set_help_flag("-h,--help", "show this help and exit");
  app.set_version_flag("--version", app.get_name() + " (ckv " CKV_VERSION ")",
                       "show the version and exit");
  app.get_formatter()->column_width(30);
  if (!footer.empty()) app.footer(footer);
}

namespace {

// "kvctl put": the names of `app` and of the subcommands chosen under it.
std::string CommandPath(const CLI::App& app) {
  std::string path = app.get_name();
  const CLI::App* at = &app;
  while (true) {
    const std::vector<const CLI::App*> chosen = at->get_subcommands({});
    const auto it =
        std::find_if(chosen.begin(), chosen.end(), [](const CLI::App* s) { return s->parsed(); });
    if (it == chosen.end()) break;
    at = *it;
    path += " " + at->get_name();
  }
  return path;
}

}  // namespace

std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  return Parse(app, std::vector<std::string>(argv + std::min(argc, 1), argv + argc));
}

std::optional<int> Parse(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes its arguments last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return kExitOk;
  } catch (const CLI::CallForVersion& e) {
    std::printf("%s\n", e.what());
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    return UsageError(app.get_name(), e.what(), CommandPath(app));
  }
  return std::nullopt;
}

int UsageError(std::string_view program, std::string_view message, std::string_view command) {
  // The message may quote an argument a script took from a file: shown, not obeyed.
  const std::string shown = Printable(message);
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(),
               shown.c_str());
  if (command.empty()) command = program;
  std::fprintf(stderr, "Run '%.*s --help' for usage.\n", static_cast<int>(command.size()),
               command.data());
  return kExitUsage;
}

CLI::Option* AddParsed(CLI::App& app, const std::string& name, const std::string& help,
                       const std::string& type_name, const std::string& what,
                       std::function<bool(const std::string&)> parse) {
  return app
      .add_option_function<std::string>(
          name,
          [name, what, parse = std::move(parse)](const std::string& text) {
            if (!parse(text)) throw CLI::ValidationError(name + ": '" + text + "' is not " + what);
          },
          help)
      ->type_name(type_name);
}

CLI::Option* AddBytes(CLI::App& app, const std::string& name, uint64_t* out,
                      const std::string& help) {
  return AddParsed(app, name, help, "BYTES",
                   "a byte count (an integer, optionally with a K/M/G/T suffix)",
                   [out](const std::string& text) { return ParseBytes(text, out); });
}

CLI::Option* AddDouble(CLI::App& app, const std::string& name, double* out, const std::string& help,
                       const std::string& type_name) {
  return AddParsed(app, name, help, type_name, "a number",
                   [out](const std::string& text) { return ParseDouble(text, out); });
}

CLI::Option* AddChoice(CLI::App& app, const std::string& name, std::string* out,
                       const std::vector<std::string>& choices, const std::string& help) {
  std::string what;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) what += i + 1 == choices.size() ? " or " : ", ";
    what += choices[i];
  }
  std::string type_name;
  for (const std::string& c : choices) type_name += (type_name.empty() ? "" : "|") + c;
  return AddParsed(app, name, help, type_name, what, [out, choices](const std::string& text) {
    if (std::find(choices.begin(), choices.end(), text) == choices.end()) return false;
    *out = text;
    return true;
  });
}

CLI::Option* AddLayerCount(CLI::App& app, uint32_t* layers) {
  return AddParsed(app, "--layers", "all (default) or the first N layers", "all|N",
                   "'all' or a layer count", [layers](const std::string& v) {
                     uint64_t n = 0;
                     if (v == "all") return true;
                     if (!ParseUint(v, &n) || n > UINT32_MAX) return false;
                     *layers = static_cast<uint32_t>(n);
                     return true;
                   });
}

CLI::Option* AddJson(CLI::App& app, JsonOutput* out) {
  return app
      .add_option_function<std::string>(
          "--json",
          [out](const std::string& path) {
            out->enabled = true;
            out->path = path;
          },
          "one JSON object on stdout instead of the table; with PATH, in PATH (table on stdout)")
      ->expected(0, 1)
      ->type_name("[PATH]");
}

absl::Status JsonOutput::Write(std::string_view json) const {
  if (ToStdout()) {
    std::fwrite(json.data(), 1, json.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    return absl::OkStatus();
  }
  // Through tools/output_file.h: never through a link planted at PATH or beside it, mode 0600,
  // and PATH is the old file or the whole new one.
  std::string text(json);
  text.push_back('\n');
  return tools::WriteOutputFile(path, text);
}

}  // namespace ckv::cli
