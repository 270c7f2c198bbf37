#include "common/http/origin_health.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

#include "common/base/clock.h"

namespace ghost {
namespace {

TEST(OriginErrnoTest, MapsHttpStatusesAndUnreachableOrigins) {
  EXPECT_EQ(OriginErrno(Status::Ok(), 404), ENOENT);
  EXPECT_EQ(OriginErrno(Status::Ok(), 410), ENOENT);
  EXPECT_EQ(OriginErrno(Status::Ok(), 401), EACCES);
  EXPECT_EQ(OriginErrno(Status::Ok(), 403), EACCES);
  EXPECT_EQ(OriginErrno(Status::Ok(), 500), EIO);
  EXPECT_EQ(OriginErrno(Status::Unavailable("x").WithErrno(ECONNREFUSED), 0), ECONNREFUSED);
  EXPECT_EQ(OriginErrno(Status::Unavailable("x").WithErrno(EHOSTUNREACH), 0), EHOSTUNREACH);
  // Unreachable without a recorded errno: nothing reached the host.
  EXPECT_EQ(OriginErrno(Status::Unavailable("x"), 0), EHOSTUNREACH);
  EXPECT_EQ(OriginErrno(Status::TimedOut("x"), 0), ETIMEDOUT);
  EXPECT_EQ(OriginErrno(Status::Corruption("x"), 0), EIO);
}

TEST(OriginErrnoTest, HttpStatusBecomesAStatusWithTheSameErrno) {
  EXPECT_EQ(OriginHttpStatus("http://o/d/", 403).ToErrno(), EACCES);
  EXPECT_EQ(OriginHttpStatus("http://o/d/", 404).ToErrno(), ENOENT);
  EXPECT_EQ(OriginHttpStatus("http://o/d/", 502).ToErrno(), EIO);
  EXPECT_NE(OriginHttpStatus("http://o/d/", 403).message().find("http://o/d/"), std::string::npos);
}

class OriginHealthTest : public ::testing::Test {
 protected:
  VirtualClock clock_;
  OriginHealth health_{clock_, {{"web", "http://127.0.0.1:8080/"}, {"docs", "http://127.0.0.1:8080/docs/"}}};
  std::vector<std::pair<std::string, OriginHealth::State>> changes_;
  void SetUp() override {
    health_.on_change = [this](const std::string& n, OriginHealth::State s) { changes_.emplace_back(n, s); };
  }
};

TEST_F(OriginHealthTest, GoesDownWhenUnreachableAndUpAgainOnAnyAnswer) {
  EXPECT_EQ(health_.state("web"), OriginHealth::State::kUnknown);
  health_.Record("GET", "http://127.0.0.1:8080/a.txt", 200, Status::Ok());
  EXPECT_EQ(health_.state("web"), OriginHealth::State::kUp);
  health_.Record("GET", "http://127.0.0.1:8080/b.txt", 0,
                 Status::Unavailable("GET http://127.0.0.1:8080/b.txt: refused").WithErrno(ECONNREFUSED));
  EXPECT_EQ(health_.state("web"), OriginHealth::State::kDown);
  clock_.AdvanceBy(Seconds(5));
  // A 404 is an answer: the server is there.
  health_.Record("GET", "http://127.0.0.1:8080/c.txt", 404, Status::Ok());
  EXPECT_EQ(health_.state("web"), OriginHealth::State::kUp);
  ASSERT_EQ(changes_.size(), 3u);
  EXPECT_EQ(changes_[1].second, OriginHealth::State::kDown);
  EXPECT_EQ(changes_[2].second, OriginHealth::State::kUp);
  nlohmann::json j = health_.ToJson();
  EXPECT_EQ(j["web"]["state"], "up");
  EXPECT_EQ(j["web"]["fetches"], 3);
  EXPECT_EQ(j["web"]["failures"], 2);
  EXPECT_EQ(j["web"]["last_failure"]["errno"], "ENOENT");
  EXPECT_EQ(j["web"]["last_failure"]["url"], "http://127.0.0.1:8080/c.txt");
}

// Out of descriptors here (curl's socket(2) failed with EMFILE, HttpFetcher::StatusFor): the
// reader gets EMFILE, and the origin, never tried, stays up (it went down, and readers got
// ENOTCONN; round 20, helper adv20).
TEST_F(OriginHealthTest, OutOfDescriptorsHereIsNotTheOriginsFailure) {
  health_.Record("GET", "http://127.0.0.1:8080/a.txt", 200, Status::Ok());
  const Status no_fd = Status::FromErrno(EMFILE, "GET http://127.0.0.1:8080/b.txt: cannot open a socket");
  EXPECT_EQ(OriginErrno(no_fd, 0), EMFILE);
  EXPECT_EQ(OriginErrno(Status::FromErrno(ENFILE, "x"), 0), ENFILE);
  health_.Record("GET", "http://127.0.0.1:8080/b.txt", 0, no_fd);
  EXPECT_EQ(health_.state("web"), OriginHealth::State::kUp);
  nlohmann::json j = health_.ToJson();
  EXPECT_EQ(j["web"]["failures"], 1);
  EXPECT_EQ(j["web"]["last_failure"]["errno"], "EMFILE");
  ASSERT_EQ(changes_.size(), 1u);  // only unknown -> up
}

TEST_F(OriginHealthTest, AFetchBelongsToTheLongestMatchingOrigin) {
  health_.Record("GET", "http://127.0.0.1:8080/docs/x.pdf", 0, Status::TimedOut("stalled"));
  EXPECT_EQ(health_.state("docs"), OriginHealth::State::kDown);
  EXPECT_EQ(health_.state("web"), OriginHealth::State::kUnknown);
  nlohmann::json j = health_.ToJson();
  EXPECT_EQ(j["docs"]["last_failure"]["errno"], "ETIMEDOUT");
  EXPECT_TRUE(j["web"]["last_failure"].is_null());
}

TEST_F(OriginHealthTest, AnHttpErrorCountsAsAFailureButKeepsTheOriginUp) {
  health_.Record("GET", "http://127.0.0.1:8080/secret/", 403, Status::Ok());
  EXPECT_EQ(health_.state("web"), OriginHealth::State::kUp);
  EXPECT_EQ(health_.ToJson()["web"]["last_failure"]["errno"], "EACCES");
}

TEST(OriginHealthImapTest, AnImapOriginGoesDownWhenUnreachableAndARefusedLoginIsUpButEacces) {
  VirtualClock clock;
  OriginHealth health(clock, {{"mail", "imaps://alice@127.0.0.1:9993/"}});
  std::vector<OriginHealth::State> changes;
  health.on_change = [&](const std::string&, OriginHealth::State s) { changes.push_back(s); };
  health.RecordImap("imaps://alice@127.0.0.1:9993/", false,
                    Status::Unavailable("connect 127.0.0.1:9993: refused").WithErrno(ECONNREFUSED));
  EXPECT_EQ(health.state("mail"), OriginHealth::State::kDown);
  nlohmann::json j = health.ToJson();
  EXPECT_EQ(j["mail"]["failures"], 1);
  EXPECT_EQ(j["mail"]["last_failure"]["errno"], "ECONNREFUSED");
  // The server answers but refuses the password: it is up; readers get EACCES.
  health.RecordImap("imaps://alice@127.0.0.1:9993/", true, Status::PermissionDenied("LOGIN failed"));
  EXPECT_EQ(health.state("mail"), OriginHealth::State::kUp);
  j = health.ToJson();
  EXPECT_EQ(j["mail"]["failures"], 2);
  EXPECT_EQ(j["mail"]["last_failure"]["errno"], "EACCES");
  health.RecordImap("imaps://alice@127.0.0.1:9993/", true, Status::Ok());
  EXPECT_EQ(health.ToJson()["mail"]["fetches"], 3);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], OriginHealth::State::kDown);
  EXPECT_EQ(changes[1], OriginHealth::State::kUp);
}

}  // namespace
}  // namespace ghost
