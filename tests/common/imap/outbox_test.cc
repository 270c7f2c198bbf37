// Tests of the durable outbox (common/imap/outbox.h).
#include "common/imap/outbox.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

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

// Round 19: an envelope whose fields have the wrong types threw nlohmann's type_error out of
// ReadEnvelope (ghostctl outbox and ghostproxy's start aborted); one whose id is not its file's
// name pointed Remove and DataPath at other files. Each is now an error naming the file (Open)
// or left out of the listing (ListOutbox).
TEST_F(OutboxTest, AnEnvelopeOfTheWrongShapeIsAnErrorNotACrash) {
  const char* bad[] = {
      R"({"id": 5})",
      R"({"id": "x", "size": "big"})",
      R"({"id": "x", "size": -1})",
      R"({"id": "x", "size": 1.5})",
      R"({"id": "x", "from": null})",
      R"({"id": "x", "rcpts": "b@c"})",
      R"({"id": "x", "rcpts": ["b@c", 7]})",
      R"({"id": "x", "user": ["u"]})",
      R"({"id": "x", "received_unix": "now"})",
      R"({"id": "x", "refused": "no"})",
      R"({"id": "x", "reply": 550})",
      R"({"id": "../../elsewhere"})",
      R"({"id": "y"})",
      "[1, 2]",
      "{\"id\": \"x\", \"from\": \"\xff\"}",
  };
  { ASSERT_TRUE(Outbox::Open(dir_).ok()); }
  for (const char* text : bad) {
    SCOPED_TRACE(text);
    { std::ofstream(dir_ + "/msg/x.json") << text; }
    { std::ofstream(dir_ + "/msg/x.eml") << "body"; }
    Result<std::unique_ptr<Outbox>> o = Outbox::Open(dir_);
    ASSERT_FALSE(o.ok());
    EXPECT_NE(o.status().message().find(dir_ + "/msg/x.json"), std::string::npos) << o.status().ToString();
    Result<nlohmann::json> list = ListOutbox(dir_);
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    EXPECT_EQ((*list)["waiting"].size(), 0u) << list->dump();
  }
  // The same file with the right shape is read.
  { std::ofstream(dir_ + "/msg/x.json") << R"({"id": "x", "from": "a@b", "rcpts": ["c@d"], "size": 4})"; }
  Result<std::unique_ptr<Outbox>> o = Outbox::Open(dir_);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ((*o)->waiting().size(), 1u);
  EXPECT_EQ((*o)->waiting()[0].rcpts, std::vector<std::string>{"c@d"});
}

// Round 19: bytes that are not UTF-8 (an 8-bit address or AUTH user from a client, an 8-bit
// reply from the server) made the envelope's JSON dump throw: ghostproxy aborted.
TEST_F(OutboxTest, BytesThatAreNotUtf8AreRefusedOrReplacedNeverThrown) {
  auto o = Outbox::Open(dir_);
  ASSERT_TRUE(o.ok());
  for (auto [from, rcpt, user] : {std::tuple<std::string, std::string, std::string>{"\xff@b", "c@d", ""},
                                  {"a@b", "c\xc3@d", ""},
                                  {"a@b", "c@d", "us\xfe" "er"}}) {
    Result<OutboxMessage> m = (*o)->Put(from, {rcpt}, user, "body");
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), Status::Code::kInvalidArgument) << m.status().ToString();
  }
  EXPECT_TRUE((*o)->waiting().empty());
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/msg"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_ + "/tmp"));
  // A server's refusal with 8-bit bytes is kept, readably.
  Result<OutboxMessage> m = (*o)->Put("a@b", {"c@d"}, "", "body");
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*o)->Refuse(m->id, "550 5.1.1 \xe9tranger inconnu").ok());
  auto list = ListOutbox(dir_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ((*list)["refused"].size(), 1u);
  EXPECT_EQ((*list)["refused"][0]["id"], m->id);
  EXPECT_TRUE((*o)->waiting().empty());
}

}  // namespace
}  // namespace ghost
