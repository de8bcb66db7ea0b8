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
  // The C1 CSI (U+009B) UTF-8 encoded, a lone 0x9b (CSI to an 8-bit terminal), a truncated
  // sequence and an overlong '/' are escaped byte by byte.
  EXPECT_EQ(Printable("a\xc2\x9b"
                      "2Jb"),
            "a\\xc2\\x9b2Jb");
  EXPECT_EQ(Printable("a\x9b"
                      "2J"),
            "a\\x9b2J");
  EXPECT_EQ(Printable("end\xe2\x82"), "end\\xe2\\x82");
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");
  // Plain text, UTF-8 (2, 3 and 4 bytes) and backslashes are kept as they are.
  EXPECT_TRUE(IsPrintable("\xc2\xa0 \xe2\x82\xac \xf0\x9f\x99\x82"));
  EXPECT_EQ(Printable("qwen2.5-7b \xc3\xa9t\xc3\xa9 C:\\path"),
            "qwen2.5-7b \xc3\xa9t\xc3\xa9 C:\\path");
  EXPECT_TRUE(IsPrintable("qwen2.5-7b"));
  EXPECT_FALSE(IsPrintable("a\x1b"));
  // Escaping twice changes nothing more: a message escaped once may be logged again.
  const std::string once = Printable("x\x1b[31my\xc2\x9b");
  EXPECT_EQ(Printable(once), once);
}

}  // namespace
}  // namespace ckv
