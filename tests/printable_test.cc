// SPDX-License-Identifier: Apache-2.0
// ckv::Printable (include/ckv/log.h): control bytes escaped, everything else kept, idempotent.
#include <string>

#include "ckv/log.h"
#include "gtest/gtest.h"

namespace ckv {
namespace {

TEST(PrintableTest, EscapesWhatATerminalWouldObeyAndKeepsTheRest) {
  // An OSC sequence that retitles a terminal, a cursor move, a bell, a DEL.
  EXPECT_EQ(Printable("model\x1b]0;pwned\x07"), "model\\x1b]0;pwned\\x07");
  EXPECT_EQ(Printable("a\x1b[2Jb\x7f"), "a\\x1b[2Jb\\x7f");
  EXPECT_EQ(Printable("line\r\nnext\t!"), "line\\r\\nnext\\t!");
  EXPECT_EQ(Printable(std::string("nul\0byte", 8)), "nul\\x00byte");
  // Plain text, UTF-8 and backslashes are kept as they are.
  EXPECT_EQ(Printable("qwen2.5-7b \xc3\xa9t\xc3\xa9 C:\\path"), "qwen2.5-7b \xc3\xa9t\xc3\xa9 C:\\path");
  EXPECT_TRUE(IsPrintable("qwen2.5-7b"));
  EXPECT_FALSE(IsPrintable("a\x1b"));
  // Escaping twice changes nothing more: a message escaped once may be logged again.
  const std::string once = Printable("x\x1b[31my");
  EXPECT_EQ(Printable(once), once);
}

}  // namespace
}  // namespace ckv
