// Tests of the durable outbox (common/imap/outbox.h).
#include "common/imap/outbox.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ghost {
namespace {

class OutboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ghost-outbox-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static std::string Read(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  std::string dir_;
};

TEST_F(OutboxTest, KeepsAPutMessageAcrossAReopen) {
  std::string id;
  {
    auto o = Outbox::Open(dir_);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto m = (*o)->Put("a@b", {"c@d", "e@f"}, "ghost", "Subject: x\r\n\r\nbody\r\n");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    id = m->id;
    EXPECT_EQ((*o)->waiting_bytes(), 20u);
  }
  auto o = Outbox::Open(dir_);
  ASSERT_TRUE(o.ok());
  ASSERT_EQ((*o)->waiting().size(), 1u);
  const OutboxMessage& m = (*o)->waiting()[0];
  EXPECT_EQ(m.id, id);
  EXPECT_EQ(m.from, "a@b");
  EXPECT_EQ(m.rcpts, (std::vector<std::string>{"c@d", "e@f"}));
  EXPECT_EQ(m.user, "ghost");
  EXPECT_EQ(Read((*o)->DataPath(id)), "Subject: x\r\n\r\nbody\r\n");
}

TEST_F(OutboxTest, DropsAnIncompletePutAtOpen) {
  { ASSERT_TRUE(Outbox::Open(dir_).ok()); }
  // A crash between the two renames: the message file without its envelope.
  std::ofstream(dir_ + "/msg/123.eml") << "half";
  std::ofstream(dir_ + "/tmp/124.eml") << "tmp";
  auto o = Outbox::Open(dir_);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE((*o)->waiting().empty());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/msg/123.eml"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/tmp/124.eml"));
}

TEST_F(OutboxTest, RemoveAndRefuse) {
  auto o = Outbox::Open(dir_);
  ASSERT_TRUE(o.ok());
  auto sent = (*o)->Put("a@b", {"c@d"}, "", "one");
  auto refused = (*o)->Put("a@b", {"x@d"}, "", "two");
  ASSERT_TRUE(sent.ok() && refused.ok());
  ASSERT_TRUE((*o)->Remove(sent->id).ok());
  ASSERT_TRUE((*o)->Refuse(refused->id, "550 5.1.1 no such user").ok());
  EXPECT_TRUE((*o)->waiting().empty());
  auto list = ListOutbox(dir_);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ((*list)["waiting"].size(), 0u);
  ASSERT_EQ((*list)["refused"].size(), 1u);
  EXPECT_EQ((*list)["refused"][0]["reply"], "550 5.1.1 no such user");
  EXPECT_EQ(Read(dir_ + "/refused/" + refused->id + ".eml"), "two");
  // Refused mail is not sent again after a restart.
  auto again = Outbox::Open(dir_);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->waiting().empty());
}

TEST_F(OutboxTest, ListOutboxNamesADirectoryThatIsNone) {
  auto list = ListOutbox(dir_ + "/nothing");
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("not an outbox"), std::string::npos);
}

}  // namespace
}  // namespace ghost
