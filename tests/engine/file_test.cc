// Files kolo writes for a user: links refused, other users' files left alone, FIFOs never block,
// replacements atomic, reads bounded.
// kolo-test-links: kolo_common
#include "engine/common/file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kolo {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kolo-file-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }

  std::string dir_;
};

TEST_F(FileTest, ALinkIsNeverWrittenThrough) {
  const std::string victim = Path("victim"), link = Path("link");
  Write(victim, "precious");
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  auto fd = OpenForWriting(link, 0644, "timeline file");
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("'" + link + "' is a symbolic link"), std::string::npos)
      << fd.status().message();
  EXPECT_FALSE(CheckWritable(link, "--json").ok());
  EXPECT_EQ(Read(victim), "precious");
  // An atomic replacement replaces the link itself, never its target.
  ASSERT_TRUE(WriteFileAtomically(link, "new", 0644, "--json").ok());
  EXPECT_EQ(Read(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(link));
  EXPECT_EQ(Read(link), "new");
}

TEST_F(FileTest, ExistingOwnFileIsTruncatedAndNewFilesGetTheirMode) {
  const std::string own = Path("own");
  Write(own, "old contents, longer than the new");
  auto fd = OpenForWriting(own, 0600, "timeline file");
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_EQ(::write(*fd, "x", 1), 1);
  ::close(*fd);
  EXPECT_EQ(Read(own), "x");
  const mode_t old_mask = ::umask(022);
  ASSERT_TRUE(WriteFileAtomically(Path("record.json"), "{}", 0644, "--json").ok());
  fd = OpenForWriting(Path("private"), 0600, "timeline file");
  ::umask(old_mask);
  ASSERT_TRUE(fd.ok());
  ::close(*fd);
  struct stat st {};
  ASSERT_EQ(::stat(Path("record.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  ASSERT_EQ(::stat(Path("private").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // No temporary file is left beside the record.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 3);
}

TEST_F(FileTest, AnotherUsersFileIsLeftAlone) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user";
  const std::string theirs = Path("theirs");
  Write(theirs, "theirs");
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  auto fd = OpenForWriting(theirs, 0644, "--json");
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("belongs to user 65534"), std::string::npos);
  EXPECT_FALSE(CheckWritable(theirs, "--json").ok());
  EXPECT_FALSE(WriteFileAtomically(theirs, "mine", 0644, "--json").ok());
  EXPECT_EQ(Read(theirs), "theirs");
}

TEST_F(FileTest, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto fd = OpenForWriting(fifo, 0644, "timeline file");  // no reader: must not block
  ASSERT_FALSE(fd.ok());
  auto read = ReadFileBounded(fifo, 1024, "replay profile");  // no writer: must not block
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("not a regular file"), std::string::npos);
}

TEST_F(FileTest, CharacterDevicesAreWritableAndDirectoriesAreNot) {
  EXPECT_TRUE(CheckWritable("/dev/null", "--json").ok());
  EXPECT_TRUE(WriteFileAtomically("/dev/null", "discarded", 0644, "--json").ok());
  EXPECT_TRUE(fs::exists("/dev/null") && !fs::is_regular_file("/dev/null"));
  Status s = CheckWritable(dir_, "--json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is a directory"), std::string::npos);
  s = CheckWritable(Path("no/such/dir/file"), "--json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("does not exist"), std::string::npos);
  EXPECT_TRUE(CheckWritable(Path("new.json"), "--json").ok());
  EXPECT_FALSE(fs::exists(Path("new.json"))) << "a check creates nothing";
}

TEST_F(FileTest, ReadsAreBounded) {
  Write(Path("small"), "12345");
  auto ok = ReadFileBounded(Path("small"), 5, "replay profile");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "12345");
  auto big = ReadFileBounded(Path("small"), 4, "replay profile");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("is 5 bytes, more than the 4 allowed"), std::string::npos);
  EXPECT_FALSE(ReadFileBounded("/dev/zero", 1 << 20, "replay profile").ok());
  EXPECT_FALSE(ReadFileBounded(Path("missing"), 10, "replay profile").ok());
}

// Whatever is not a regular file is refused at once, naming the path, what it is and what is
// allowed: a FIFO with no writer and one whose writer never stops (either would hang a reader),
// /dev/zero (which never ends), a directory. Also files of /proc, whose size says 0, are read.
TEST_F(FileTest, ReadsRefuseWhatIsNotARegularFileWithoutWaiting) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto refused = [](const std::string& path, const std::string& kind) {
    const auto t0 = std::chrono::steady_clock::now();
    auto read = ReadFileBounded(path, 1 << 20, "--calibration");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 2.0) << path;
    ASSERT_FALSE(read.ok()) << path;
    const std::string& m = read.status().message();
    EXPECT_NE(m.find("--calibration '" + path + "' is " + kind + ", not a regular file"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("kolo reads only regular files (of at most 1048576 bytes)"), std::string::npos)
        << m;
  };
  refused(fifo, "a FIFO");
  {
    // A writer holds the FIFO open (O_RDWR opens it without waiting for a reader) and has filled
    // it: still refused, not read.
    const int writer = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
    ASSERT_GE(writer, 0);
    const std::string bytes(4096, 'x');
    ASSERT_EQ(::write(writer, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    refused(fifo, "a FIFO");
    ::close(writer);
  }
  refused("/dev/zero", "a character device");
  refused(dir_, "a directory");
  // A link to /dev/zero is followed and refused for what it leads to.
  ASSERT_EQ(::symlink("/dev/zero", Path("zero-link").c_str()), 0);
  refused(Path("zero-link"), "a character device");

  Write(Path("big"), std::string(1001, 'y'));
  auto big = ReadFileBounded(Path("big"), 1000, "--calibration");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("'" + Path("big") +
                                        "' is 1001 bytes, more than the 1000 "
                                        "allowed"),
            std::string::npos)
      << big.status().message();

  auto proc = ReadFileBounded("/proc/self/status", 1 << 20, "process status");
  ASSERT_TRUE(proc.ok()) << proc.status().ToString();
  EXPECT_NE(proc->find("VmRSS"), std::string::npos);
  auto small = ReadFileBounded("/proc/self/status", 16, "process status");
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("grew past the 16 bytes allowed"), std::string::npos)
      << small.status().message();
}

}  // namespace
}  // namespace kolo
