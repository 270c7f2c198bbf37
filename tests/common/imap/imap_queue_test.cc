#include "common/imap/imap_queue.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/power/device.h"
#include "common/power/power_manager.h"
#include "common/power/profile.h"

namespace ghost {
namespace {

constexpr int kCam = 0;
constexpr int kPsm = 1;

ImapOp Append(std::string body, std::string name = "new/x") {
  ImapOp op;
  op.kind = ImapOp::Kind::kAppend;
  op.origin = "mail";
  op.mailbox = "INBOX";
  op.flags = {"\\Seen"};
  op.internaldate = 1700000000;
  op.local_name = std::move(name);
  op.body = std::move(body);
  return op;
}

ImapOp Store(std::uint32_t uid, std::vector<std::string> flags) {
  ImapOp op;
  op.kind = ImapOp::Kind::kStore;
  op.origin = "mail";
  op.mailbox = "Work/Reports";
  op.uidvalidity = 77;
  op.uid = uid;
  op.flags = std::move(flags);
  return op;
}

class ImapQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/imap-queue-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.journal_path = dir_ + "/imap-journal";
    Result<DeviceProfile> profile = LoadDeviceProfile("cisco-350", GHOST_PROFILE_DIR);
    ASSERT_TRUE(profile.ok()) << profile.status().ToString();
    net_ = std::make_unique<Device>(clock_, *profile, &link_, kPsm);
    pm_ = std::make_unique<PowerManager>(clock_, Power::Milliwatts(1440), 50);
    net_id_ = pm_->Register(net_.get(), nullptr);
  }

  void TearDown() override {
    queue_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A sender that records each op and answers with `outcome_` (now, or later when `hold_`).
  void OpenQueue() {
    queue_.reset();
    Result<std::unique_ptr<ImapQueue>> q = ImapQueue::Open(
        options_, *pm_, net_id_, [this](const ImapOp& op, std::function<void(SendOutcome)> done) {
          sent_.push_back(op);
          if (hold_) {
            held_ = std::move(done);
            return;
          }
          done(outcome_);
        });
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    queue_ = std::move(q).value();
  }

  void WakeNetwork() {
    net_->RequestMode(kCam);
    clock_.RunUntilIdle();
    ASSERT_EQ(net_->mode(), kCam);
  }

  std::uint64_t JournalSize() const { return std::filesystem::file_size(options_.journal_path); }

  VirtualClock clock_;
  Link link_;
  std::string dir_;
  ImapQueueOptions options_;
  std::unique_ptr<Device> net_;
  std::unique_ptr<PowerManager> pm_;  // after net_: deregisters it before it is destroyed
  DeviceId net_id_ = -1;
  std::unique_ptr<ImapQueue> queue_;
  std::vector<ImapOp> sent_;
  SendOutcome outcome_ = SendOutcome::kDone;
  bool hold_ = false;
  std::function<void(SendOutcome)> held_;
};

TEST_F(ImapQueueTest, WaitsWhileTheNetworkSavesPowerAndSendsInOrderWhenItWakes) {
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append("one")).ok());
  ASSERT_TRUE(queue_->Add(Store(5, {"\\Seen", "\\Flagged"})).ok());
  EXPECT_TRUE(sent_.empty());
  EXPECT_EQ(queue_->pending().size(), 2u);
  WakeNetwork();
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_EQ(sent_[0].body, "one");
  EXPECT_EQ(sent_[1].uid, 5u);
  EXPECT_TRUE(queue_->pending().empty());
  EXPECT_EQ(queue_->stats().sent, 2u);
  EXPECT_EQ(queue_->stats().flushes_power_callback, 1u);
}

TEST_F(ImapQueueTest, SendsAtOnceWhenTheNetworkIsAwake) {
  WakeNetwork();
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append("now")).ok());
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(queue_->stats().flushes_active, 1u);
}

TEST_F(ImapQueueTest, SendsWhenTheQueueIsFull) {
  options_.cap_ops = 3;
  OpenQueue();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(queue_->Add(Store(i + 1, {})).ok());
  EXPECT_TRUE(sent_.empty());
  ASSERT_TRUE(queue_->Add(Store(4, {})).ok());
  EXPECT_EQ(sent_.size(), 4u);
  EXPECT_EQ(queue_->stats().flushes_cap, 1u);
}

TEST_F(ImapQueueTest, ReplaysUnacknowledgedOperationsAfterACrash) {
  OpenQueue();
  std::string big(300000, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(queue_->Add(Append(big, "cur/big:2,S")).ok());
  ImapOp store = Store(9, {"\\Answered"});
  store.remove_flags = {"\\Draft"};
  ASSERT_TRUE(queue_->Add(store).ok());
  ImapOp del;
  del.kind = ImapOp::Kind::kExpunge;
  del.origin = "mail";
  del.mailbox = "INBOX";
  del.uidvalidity = 3;
  del.uid = 11;
  del.internaldate = 1690000000;  // the message's, for finding it after a UIDVALIDITY change
  del.message_size = 4321;
  ASSERT_TRUE(queue_->Add(del).ok());
  // "Crash": the queue object goes away without sending; a new one opens the journal.
  OpenQueue();
  ASSERT_EQ(queue_->pending().size(), 3u);
  EXPECT_EQ(queue_->stats().replayed, 3u);
  EXPECT_EQ(queue_->pending()[0].body, big);
  EXPECT_EQ(queue_->pending()[0].local_name, "cur/big:2,S");
  EXPECT_EQ(queue_->pending()[0].flags, std::vector<std::string>{"\\Seen"});
  EXPECT_EQ(queue_->pending()[0].internaldate, 1700000000);
  EXPECT_EQ(queue_->pending()[1].kind, ImapOp::Kind::kStore);
  EXPECT_EQ(queue_->pending()[1].mailbox, "Work/Reports");
  EXPECT_EQ(queue_->pending()[1].uidvalidity, 77u);
  EXPECT_EQ(queue_->pending()[1].remove_flags, std::vector<std::string>{"\\Draft"});
  EXPECT_EQ(queue_->pending()[2].kind, ImapOp::Kind::kExpunge);
  EXPECT_EQ(queue_->pending()[2].uid, 11u);
  EXPECT_EQ(queue_->pending()[2].internaldate, 1690000000);
  EXPECT_EQ(queue_->pending()[2].message_size, 4321u);
  queue_->Flush();
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[0].body, big);
  EXPECT_TRUE(queue_->pending().empty());
}

TEST_F(ImapQueueTest, ReplaysAQueuedCopyWithItsDestination) {
  OpenQueue();
  ImapOp copy = Store(21, {});
  copy.kind = ImapOp::Kind::kCopy;
  copy.destination = "Archive/2026";
  ASSERT_TRUE(queue_->Add(copy).ok());
  OpenQueue();  // "crash"
  ASSERT_EQ(queue_->pending().size(), 1u);
  EXPECT_EQ(queue_->pending()[0].kind, ImapOp::Kind::kCopy);
  EXPECT_EQ(queue_->pending()[0].mailbox, "Work/Reports");
  EXPECT_EQ(queue_->pending()[0].uidvalidity, 77u);
  EXPECT_EQ(queue_->pending()[0].uid, 21u);
  EXPECT_EQ(queue_->pending()[0].destination, "Archive/2026");
  EXPECT_STREQ(ImapOpKindName(ImapOp::Kind::kCopy), "copy");
}

TEST_F(ImapQueueTest, AcknowledgedOperationsAreNotReplayed) {
  OpenQueue();
  hold_ = true;
  ASSERT_TRUE(queue_->Add(Append("a")).ok());
  ASSERT_TRUE(queue_->Add(Append("b")).ok());
  queue_->Flush();
  ASSERT_EQ(sent_.size(), 1u);
  held_(SendOutcome::kDone);  // "a" acknowledged; "b" now with the sender
  ASSERT_EQ(sent_.size(), 2u);
  ASSERT_TRUE(queue_->Add(Append("c")).ok());
  EXPECT_FALSE(sent_[1].maybe_applied);  // its first try
  OpenQueue();  // crash while "b" was being sent
  ASSERT_EQ(queue_->pending().size(), 2u);
  EXPECT_EQ(queue_->pending()[0].body, "b");
  // "b" may have reached the server before the crash; "c" was never sent (one at a time).
  EXPECT_TRUE(queue_->pending()[0].maybe_applied);
  EXPECT_FALSE(queue_->pending()[1].maybe_applied);
  // Sequence numbers go on after the replayed ones.
  Result<std::uint64_t> seq = queue_->Add(Append("d"));
  ASSERT_TRUE(seq.ok());
  EXPECT_GT(*seq, queue_->pending()[1].seq);
}

TEST_F(ImapQueueTest, RetryLaterKeepsTheOperationFirstAndStops) {
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append("a")).ok());
  ASSERT_TRUE(queue_->Add(Append("b")).ok());
  outcome_ = SendOutcome::kRetryLater;
  queue_->Flush();
  ASSERT_EQ(sent_.size(), 1u);
  EXPECT_EQ(queue_->pending().size(), 2u);
  EXPECT_FALSE(queue_->sending());
  EXPECT_EQ(queue_->stats().retries, 1u);
  outcome_ = SendOutcome::kDone;
  queue_->Flush();
  ASSERT_EQ(sent_.size(), 3u);
  EXPECT_EQ(sent_[1].body, "a");
  EXPECT_EQ(sent_[2].body, "b");
  // The failed try may have reached the server (a timeout, a connection dropped after the
  // command went out): the next try says so, so an APPEND is looked for before it is repeated.
  EXPECT_FALSE(sent_[0].maybe_applied);
  EXPECT_TRUE(sent_[1].maybe_applied);
  EXPECT_FALSE(sent_[2].maybe_applied);
}

TEST_F(ImapQueueTest, DroppedOperationsAreCountedAndAcknowledged) {
  OpenQueue();
  outcome_ = SendOutcome::kDropped;
  ASSERT_TRUE(queue_->Add(Store(1, {})).ok());
  queue_->Flush();
  EXPECT_EQ(queue_->stats().dropped, 1u);
  OpenQueue();
  EXPECT_TRUE(queue_->pending().empty());
}

TEST_F(ImapQueueTest, JournalIsCompactedWhenEverythingIsAcknowledged) {
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append(std::string(10000, 'x'))).ok());
  EXPECT_GT(JournalSize(), 10000u);
  queue_->Flush();
  EXPECT_EQ(JournalSize(), 0u);
}

TEST_F(ImapQueueTest, JournalIsRewrittenAfterManyAcks) {
  options_.compact_after = 4;
  OpenQueue();
  hold_ = true;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(queue_->Add(Store(i + 1, {"\\Seen"})).ok());
  queue_->Flush();
  for (int i = 0; i < 4; ++i) held_(SendOutcome::kDone);
  EXPECT_EQ(queue_->stats().compactions, 1u);
  EXPECT_EQ(queue_->journal_size(), JournalSize());
  OpenQueue();
  ASSERT_EQ(queue_->pending().size(), 6u);
  EXPECT_EQ(queue_->pending()[0].uid, 5u);
}

TEST_F(ImapQueueTest, TornTailIsCutOffAndEarlierRecordsSurvive) {
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append("first")).ok());
  std::uint64_t good = JournalSize();
  ASSERT_TRUE(queue_->Add(Append(std::string(5000, 'y'))).ok());
  queue_.reset();
  // A crash in the middle of the second record's write.
  std::filesystem::resize_file(options_.journal_path, good + 100);
  OpenQueue();
  ASSERT_EQ(queue_->pending().size(), 1u);
  EXPECT_EQ(queue_->pending()[0].body, "first");
  EXPECT_EQ(queue_->warnings().size(), 1u);
  EXPECT_EQ(JournalSize(), good);
  // New records go after the good ones.
  ASSERT_TRUE(queue_->Add(Append("third")).ok());
  OpenQueue();
  ASSERT_EQ(queue_->pending().size(), 2u);
  EXPECT_EQ(queue_->pending()[1].body, "third");
}

TEST_F(ImapQueueTest, CorruptedBodyIsDetectedByItsChecksum) {
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append("keep")).ok());
  std::uint64_t good = JournalSize();
  ASSERT_TRUE(queue_->Add(Append("zzzzzzzz")).ok());
  queue_.reset();
  {
    std::fstream f(options_.journal_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(JournalSize() - 3));
    f.put('Q');
  }
  OpenQueue();
  ASSERT_EQ(queue_->pending().size(), 1u);
  EXPECT_EQ(JournalSize(), good);
}

// Round 19 (files19): a damaged record anywhere in the journal. Before, Replay read an ack's
// seq and a record's fields with nlohmann's get<>()/value(), which throw type_error on a field
// of another type (Open threw: ghostfs aborted at every mount, the journal kept); trusted
// body_bytes before the checksum (a huge one wrapped the bounds check: a read far past the
// journal); and cut the journal at the first bad record, so every queued operation after it
// (a reader's APPEND) was lost without a trace. Now a damaged record is kept aside in
// JOURNAL.damaged, named in a warning, and the records after it are replayed.

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

// A record as EncodeOp writes it, from any header (its checksum right): FNV-1a 64 of the
// header's dump and the body.
std::string RecordWithValidSum(nlohmann::json h, const std::string& body) {
  auto dump = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  std::uint64_t sum = 1469598103934665603ull;
  for (const std::string& s : {dump(h), body}) {
    for (unsigned char c : s) {
      sum ^= c;
      sum *= 1099511628211ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(sum));
  h["sum"] = hex;
  return dump(h) + "\n" + body + "\n";
}

class ImapQueueDamageTest : public ImapQueueTest {
 protected:
  // Journals appends "one", "two", "three" and returns the journal's bytes split into them.
  std::vector<std::string> ThreeRecords() {
    OpenQueue();
    std::vector<std::uint64_t> ends = {0};
    for (const char* body : {"one", "two", "three"}) {
      EXPECT_TRUE(queue_->Add(Append(body)).ok());
      ends.push_back(JournalSize());
    }
    queue_.reset();
    std::string all = ReadFile(options_.journal_path);
    std::vector<std::string> r;
    for (int i = 0; i < 3; ++i) r.push_back(all.substr(ends[i], ends[i + 1] - ends[i]));
    return r;
  }

  std::vector<std::string> Bodies() const {
    std::vector<std::string> b;
    for (const ImapOp& op : queue_->pending()) b.push_back(op.body);
    return b;
  }

  std::string Aside() const { return options_.journal_path + ".damaged"; }
};

TEST_F(ImapQueueDamageTest, AnAckOfAnotherTypeIsKeptAsideAndTheRestReplayed) {
  std::vector<std::string> r = ThreeRecords();
  WriteFile(options_.journal_path, r[0] + "{\"ack\":\"1\"}\n" + r[1] + r[2]);
  OpenQueue();  // threw type_error 302 before
  EXPECT_EQ(Bodies(), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(ReadFile(Aside()), "{\"ack\":\"1\"}\n");
  ASSERT_EQ(queue_->warnings().size(), 1u);
  EXPECT_NE(queue_->warnings()[0].find(Aside()), std::string::npos) << queue_->warnings()[0];
  // The journal was rewritten without it: the next open finds nothing damaged.
  OpenQueue();
  EXPECT_EQ(Bodies(), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_TRUE(queue_->warnings().empty());
}

TEST_F(ImapQueueDamageTest, AHugeBodyLengthIsADamagedRecordNotAReadPastTheJournal) {
  std::vector<std::string> r = ThreeRecords();
  nlohmann::json h = {{"op", "append"}, {"seq", 9}, {"origin", "mail"}, {"mailbox", "INBOX"},
                      {"body_bytes", std::numeric_limits<std::uint64_t>::max()}};
  // With its checksum right over a body of one byte: body_bytes alone is wrong. Before, the
  // bounds check wrapped (nl + 1 + 2^64-1 + 1 == nl + 1) and the checksum read 2^64-1 bytes.
  std::string bad = RecordWithValidSum(h, "x");
  WriteFile(options_.journal_path, r[0] + bad + r[1] + r[2]);
  OpenQueue();
  EXPECT_EQ(Bodies(), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(ReadFile(Aside()), bad);
}

TEST_F(ImapQueueDamageTest, FieldsOfAnotherTypeUnderAValidChecksumAreADamagedRecord) {
  std::vector<std::string> r = ThreeRecords();
  std::string bad_flags = RecordWithValidSum(
      {{"op", "append"}, {"seq", 7}, {"origin", "mail"}, {"mailbox", "INBOX"}, {"body_bytes", 4}, {"flags", "\\Seen"}},
      "body");
  std::string bad_uid = RecordWithValidSum(
      {{"op", "store"}, {"seq", 8}, {"origin", "mail"}, {"mailbox", "INBOX"}, {"body_bytes", 0}, {"uid", -1}}, "");
  std::string bad_seq = RecordWithValidSum(
      {{"op", "expunge"}, {"seq", 1e300}, {"origin", "mail"}, {"mailbox", "INBOX"}, {"body_bytes", 0}}, "");
  WriteFile(options_.journal_path, r[0] + bad_flags + r[1] + bad_uid + bad_seq + r[2]);
  OpenQueue();
  EXPECT_EQ(Bodies(), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(ReadFile(Aside()), bad_flags + bad_uid + bad_seq);
  EXPECT_EQ(queue_->warnings().size(), 2u);
}

TEST_F(ImapQueueDamageTest, ADamagedRecordInTheMiddleLosesNothingAfterIt) {
  std::vector<std::string> r = ThreeRecords();
  std::string damaged = r[1];
  damaged[damaged.size() - 3] = 'Q';  // "two" -> "tQo": the checksum no longer matches
  WriteFile(options_.journal_path, r[0] + damaged + r[2]);
  OpenQueue();
  // Before: "one" only, "three" cut off with it.
  EXPECT_EQ(Bodies(), (std::vector<std::string>{"one", "three"}));
  EXPECT_EQ(ReadFile(Aside()), damaged);
  // The operation after a damaged region may have been sent (its ack may be what was lost).
  EXPECT_TRUE(queue_->pending()[1].maybe_applied);
  // New operations follow, and survive another open.
  ASSERT_TRUE(queue_->Add(Append("four")).ok());
  OpenQueue();
  EXPECT_EQ(Bodies(), (std::vector<std::string>{"one", "three", "four"}));
  EXPECT_EQ(ReadFile(Aside()), damaged);
}

TEST_F(ImapQueueDamageTest, TruncatedJsonAndBytesThatAreNotUtf8AreDamagedRecords) {
  std::vector<std::string> r = ThreeRecords();
  std::string torn = r[1].substr(0, 30) + "\n";       // a header cut short, then a newline
  std::string latin1 = "{\"ack\":1,\"x\":\"\xff\xfe\"}\n";  // not UTF-8: not JSON
  WriteFile(options_.journal_path, r[0] + torn + latin1 + r[1] + r[2]);
  OpenQueue();
  EXPECT_EQ(Bodies(), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(ReadFile(Aside()), torn + latin1);
}

TEST_F(ImapQueueDamageTest, AJournalOfNothingButDamageOpensEmpty) {
  WriteFile(options_.journal_path, std::string("\xff\x00{}\n[1,2]\n{\"op\":5}\n", 20));
  OpenQueue();
  EXPECT_TRUE(queue_->pending().empty());
  EXPECT_EQ(ReadFile(Aside()).size(), 20u);
  EXPECT_EQ(JournalSize(), 0u);
}

TEST_F(ImapQueueTest, FailsToOpenAJournalInAMissingDirectory) {
  options_.journal_path = dir_ + "/missing/journal";
  Result<std::unique_ptr<ImapQueue>> q =
      ImapQueue::Open(options_, *pm_, net_id_, [](const ImapOp&, std::function<void(SendOutcome)>) {});
  ASSERT_FALSE(q.ok());
  // A clear error: what failed, on which file.
  EXPECT_NE(q.status().message().find("opening the IMAP journal " + options_.journal_path), std::string::npos)
      << q.status().ToString();
}

}  // namespace
TEST_F(ImapQueueTest, DeadlineSendsWhatTheNetworkNeverWokeFor) {
  options_.clock = &clock_;
  options_.deadline = Seconds(60);
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Store(7, {"\\Seen"})).ok());
  clock_.AdvanceBy(Seconds(30));
  ASSERT_TRUE(queue_->Add(Store(8, {"\\Seen"})).ok());  // the oldest one's deadline counts
  clock_.AdvanceBy(Seconds(29));
  EXPECT_TRUE(sent_.empty());
  clock_.AdvanceBy(Seconds(2));
  ASSERT_EQ(sent_.size(), 2u);
  EXPECT_TRUE(queue_->pending().empty());
  EXPECT_EQ(queue_->stats().flushes_deadline, 1u);
}

TEST_F(ImapQueueTest, DeadlineScalesWithTheKnob) {
  EXPECT_EQ(DeadlineFor(Seconds(60), 50), Seconds(60));
  EXPECT_EQ(DeadlineFor(Seconds(60), 0), Seconds(120));
  EXPECT_EQ(DeadlineFor(Seconds(60), 100), Duration(0));
  options_.clock = &clock_;
  pm_->SetKnob(75);
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append("x")).ok());
  clock_.AdvanceBy(Seconds(29));
  EXPECT_TRUE(sent_.empty());
  clock_.AdvanceBy(Seconds(2));
  EXPECT_EQ(sent_.size(), 1u);
}

TEST_F(ImapQueueTest, DeadlineTriesAgainWhileTheServerIsUnreachable) {
  options_.clock = &clock_;
  OpenQueue();
  outcome_ = SendOutcome::kRetryLater;
  ASSERT_TRUE(queue_->Add(Append("x")).ok());
  clock_.AdvanceBy(Seconds(61));
  EXPECT_EQ(sent_.size(), 1u);
  EXPECT_EQ(queue_->pending().size(), 1u);
  outcome_ = SendOutcome::kDone;
  clock_.AdvanceBy(Seconds(61));
  EXPECT_EQ(sent_.size(), 2u);
  EXPECT_TRUE(queue_->pending().empty());
}

TEST_F(ImapQueueTest, FlushWithDoneSaysWhatIsLeft) {
  OpenQueue();
  std::vector<std::size_t> left;
  queue_->Flush([&](std::size_t n) { left.push_back(n); });
  ASSERT_TRUE(queue_->Add(Append("a")).ok());
  ASSERT_TRUE(queue_->Add(Append("b")).ok());
  outcome_ = SendOutcome::kRetryLater;
  queue_->Flush([&](std::size_t n) { left.push_back(n); });
  outcome_ = SendOutcome::kDone;
  hold_ = true;
  queue_->Flush([&](std::size_t n) { left.push_back(n); });
  EXPECT_EQ(left, (std::vector<std::size_t>{0, 2}));  // the last waits for the server
  hold_ = false;
  held_(SendOutcome::kDone);
  EXPECT_EQ(left, (std::vector<std::size_t>{0, 2, 0}));
}

// A reader that keeps changing the Maildir while `ghostctl sync` runs must not hold the sync
// forever (ghostfs_mail_random's "power flush: timed out" under load): the flush waits for what
// was queued when it was asked for, not for an empty queue.
TEST_F(ImapQueueTest, FlushWaitsForWhatWasQueuedNotForAnEmptyQueue) {
  OpenQueue();
  ASSERT_TRUE(queue_->Add(Append("a")).ok());
  ASSERT_TRUE(queue_->Add(Append("b")).ok());
  hold_ = true;
  std::vector<std::size_t> left;
  queue_->Flush([&](std::size_t n) { left.push_back(n); });
  ASSERT_EQ(sent_.size(), 1u);
  ASSERT_TRUE(queue_->Add(Append("c")).ok());  // arrives while "a" is with the server
  held_(SendOutcome::kDone);                   // "a" done, "b" sent
  EXPECT_TRUE(left.empty());
  ASSERT_TRUE(queue_->Add(Append("d")).ok());
  held_(SendOutcome::kDone);  // "b" done: everything queued at the flush is sent
  EXPECT_EQ(left, (std::vector<std::size_t>{0}));
  EXPECT_TRUE(queue_->sending());  // "c" and "d" go on
  held_(SendOutcome::kDone);
  held_(SendOutcome::kDone);
  EXPECT_TRUE(queue_->pending().empty());
  EXPECT_EQ(left.size(), 1u);
}

TEST(LoginBackoffTest, AFewAttemptsAMinuteAtMost) {
  EXPECT_EQ(LoginBackoff(1), Duration(0));  // the reader right after the first refusal is told
  EXPECT_EQ(LoginBackoff(2), Seconds(2));
  EXPECT_EQ(LoginBackoff(3), Seconds(4));
  EXPECT_EQ(LoginBackoff(6), Seconds(32));
  EXPECT_EQ(LoginBackoff(9), Seconds(256));
  EXPECT_EQ(LoginBackoff(50), Seconds(300));
  // Attempts in the first minute of constant access: at 0, 0, 2, 6, 14, 30 s.
  Duration at{0};
  int attempts = 0;
  for (int failures = 1; at < Seconds(60); ++failures) {
    ++attempts;
    at += LoginBackoff(failures);
  }
  EXPECT_LE(attempts, 6);
}

}  // namespace ghost
