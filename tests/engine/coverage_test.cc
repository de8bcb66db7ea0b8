// SPDX-License-Identifier: Apache-2.0
// What this machine lets the suite cover, said out loud. The engine falls back quietly (and
// rightly, for users) to buffered I/O where the store's directory refuses O_DIRECT (tmpfs before
// Linux 6.6, some FUSE and network file systems) and to the thread backend where io_uring is
// disabled (a sysctl, a container's seccomp profile): then the whole suite tests those paths and
// not the ones production uses. This test always passes; it prints one line, which
// tools/ckv.sh puts into the suite's summary line.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/file_system.h"
#include "tests/test_util.h"

namespace ckv {
namespace {

TEST(CoverageTest, SaysWhetherTheTestDirectoryHasODirectAndIoUring) {
  ::ckv::testing::TempDir dir;  // where every store of the suite lives ($TMPDIR)
  const std::string probe = dir.Sub("o_direct_probe");
  const int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  const bool direct = fd >= 0;
  if (fd >= 0) ::close(fd);
  const bool uring = io::UringAvailable();
  const char* tmpdir = std::getenv("TMPDIR");
  std::printf("ckv coverage: TMPDIR=%s: O_DIRECT %s; io_uring %s\n",
              tmpdir != nullptr ? tmpdir : "/tmp",
              direct ? "yes" : "NO (every store test ran with buffered I/O)",
              uring ? "yes" : "NO (every engine test ran on the thread backend)");
  RecordProperty("o_direct", direct ? "yes" : "no");
  RecordProperty("io_uring", uring ? "yes" : "no");
}

}  // namespace
}  // namespace ckv
