#include "common/cache/cache_index.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/base/clock.h"

namespace ghost {
namespace {

using Keys = std::vector<std::string>;

class CacheIndexTest : public ::testing::Test {
 protected:
  static CacheEntry OnDisk(Bytes size) {
    CacheEntry e;
    e.size = size;
    e.where = Residence::kDisk;
    return e;
  }
  // Inserts and returns the evicted keys; fails the test if the insert is refused.
  Keys Put(const std::string& key, Bytes size) {
    Result<Keys> r = index_.Insert(key, OnDisk(size));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    index_.AssertInvariants();
    return r.ok() ? *r : Keys{};
  }
  Keys LruOrder() const {
    Keys keys;
    index_.ForEach([&](const std::string& k, const CacheEntry&) { keys.push_back(k); });
    return keys;
  }

  VirtualClock clock_;
  CacheIndex index_{clock_};
};

TEST_F(CacheIndexTest, StatusIsAbsentForUnknownKey) {
  CacheStatus s = index_.Status("http://example.org/a", false);
  EXPECT_EQ(s.state, CacheState::kAbsent);
  EXPECT_EQ(s.size, 0u);
  EXPECT_EQ(index_.Status("http://example.org/a", true).state, CacheState::kAbsent);
}

TEST_F(CacheIndexTest, StatusIsPresentWithSizeOnceInserted) {
  Put("http://example.org/a", 4096);
  CacheStatus s = index_.Status("http://example.org/a", false);
  EXPECT_EQ(s.state, CacheState::kPresent);
  EXPECT_EQ(s.size, 4096u);
}

TEST_F(CacheIndexTest, StatusIsNetworkPreferredWhenTheCostModelSaysSo) {
  Put("imap:INBOX/42", 1234);
  CacheStatus s = index_.Status("imap:INBOX/42", true);
  EXPECT_EQ(s.state, CacheState::kPresentNetworkPreferred);
  EXPECT_EQ(s.size, 1234u);
}

TEST_F(CacheIndexTest, KeysAreComparedExactly) {
  Put("http://example.org/a", 1);
  EXPECT_EQ(index_.Status("http://example.org/A", false).state, CacheState::kAbsent);
  EXPECT_EQ(index_.Status("http://example.org/a/", false).state, CacheState::kAbsent);
  EXPECT_EQ(index_.Status("http://example.org/a", false).state, CacheState::kPresent);
}

TEST_F(CacheIndexTest, InsertStampsFetchAndAccessTimesTouchUpdatesAccess) {
  clock_.AdvanceBy(Seconds(3));
  Put("a", 10);
  const CacheEntry* e = index_.Find("a");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->fetched, TimePoint(Seconds(3)));
  EXPECT_EQ(e->last_access, TimePoint(Seconds(3)));
  clock_.AdvanceBy(Seconds(2));
  EXPECT_TRUE(index_.Touch("a"));
  e = index_.Find("a");
  EXPECT_EQ(e->fetched, TimePoint(Seconds(3)));
  EXPECT_EQ(e->last_access, TimePoint(Seconds(5)));
  EXPECT_FALSE(index_.Touch("missing"));
}

TEST_F(CacheIndexTest, StatusAndFindDoNotCountAsAccess) {
  index_.set_capacity(200);
  Put("a", 100);
  Put("b", 100);
  (void)index_.Status("a", false);
  (void)index_.Find("a");
  EXPECT_EQ(Put("c", 100), (Keys{"a"}));
}

TEST_F(CacheIndexTest, EvictsLeastRecentlyUsedFirstWhenDataIsAdded) {
  index_.set_capacity(300);
  EXPECT_TRUE(Put("a", 100).empty());
  EXPECT_TRUE(Put("b", 100).empty());
  EXPECT_TRUE(Put("c", 100).empty());
  EXPECT_TRUE(index_.Touch("a"));         // order now b, c, a
  EXPECT_EQ(Put("d", 100), (Keys{"b"}));  // order c, a, d
  EXPECT_EQ(LruOrder(), (Keys{"c", "a", "d"}));
  EXPECT_EQ(index_.EvictFor(150), (Keys{"c", "a"}));
  EXPECT_EQ(LruOrder(), (Keys{"d"}));
  EXPECT_EQ(index_.total_bytes(), 100u);
  index_.AssertInvariants();
}

TEST_F(CacheIndexTest, StaysUnderCapAndReturnsEveryVictimOfOneInsert) {
  index_.set_capacity(1000);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(Put("k" + std::to_string(i), 100).empty());
  EXPECT_EQ(index_.total_bytes(), 1000u);
  EXPECT_EQ(Put("big", 350), (Keys{"k0", "k1", "k2", "k3"}));
  EXPECT_EQ(index_.total_bytes(), 950u);
  EXPECT_LE(index_.total_bytes(), index_.capacity());
  EXPECT_EQ(index_.Status("k3", false).state, CacheState::kAbsent);
  EXPECT_EQ(index_.Status("k4", false).state, CacheState::kPresent);
}

TEST_F(CacheIndexTest, ReplacingAnEntryCountsOnlyItsNewSizeAndNeverEvictsItself) {
  index_.set_capacity(300);
  Put("a", 100);
  Put("b", 100);
  Put("c", 100);
  EXPECT_EQ(Put("a", 200), (Keys{"b"}));  // a's old 100 bytes are freed first
  EXPECT_EQ(index_.total_bytes(), 300u);
  EXPECT_EQ(LruOrder(), (Keys{"c", "a"}));
  EXPECT_EQ(index_.Find("a")->size, 200u);
}

TEST_F(CacheIndexTest, RefusesObjectLargerThanCapacityWithoutEvicting) {
  index_.set_capacity(300);
  Put("a", 100);
  Result<Keys> r = index_.Insert("huge", OnDisk(301));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ghost::Status::Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("huge"), std::string::npos);
  EXPECT_TRUE(index_.Contains("a"));
  EXPECT_FALSE(index_.Contains("huge"));
  EXPECT_TRUE(index_.EvictFor(301).empty());
  EXPECT_TRUE(index_.Contains("a"));
}

TEST_F(CacheIndexTest, ZeroCapacityIsUnlimited) {
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(Put("k" + std::to_string(i), 1 << 20).empty());
  EXPECT_EQ(index_.total_bytes(), 100u << 20);
  EXPECT_TRUE(index_.EvictFor(1ull << 40).empty());
}

TEST_F(CacheIndexTest, LoweringCapacityEvictsOnTheNextAddition) {
  Put("a", 100);
  Put("b", 100);
  index_.set_capacity(100);
  EXPECT_EQ(index_.total_bytes(), 200u);  // nothing happens by itself
  EXPECT_EQ(index_.EvictFor(0), (Keys{"a"}));
  EXPECT_EQ(index_.total_bytes(), 100u);
}

TEST_F(CacheIndexTest, EraseRemovesEntryAndItsBytes) {
  Put("a", 100);
  Put("b", 50);
  EXPECT_TRUE(index_.Erase("a"));
  EXPECT_FALSE(index_.Erase("a"));
  EXPECT_EQ(index_.total_bytes(), 50u);
  EXPECT_EQ(index_.size(), 1u);
  EXPECT_EQ(index_.Status("a", false).state, CacheState::kAbsent);
  index_.AssertInvariants();
}

TEST_F(CacheIndexTest, UpdateChangesResidenceAndValidatorsInPlace) {
  CacheEntry e = OnDisk(10);
  e.where = Residence::kWriteQueue;
  ASSERT_TRUE(index_.Insert("a", e).ok());
  Put("b", 10);
  EXPECT_TRUE(index_.Update("a", [](CacheEntry& entry) {
    entry.where.Remove(Residence::kWriteQueue).Add(Residence::kDisk);
    entry.etag = "\"v2\"";
    entry.expires = TimePoint(Seconds(60));
  }));
  const CacheEntry* a = index_.Find("a");
  EXPECT_EQ(a->where, Residences(Residence::kDisk));
  EXPECT_EQ(a->etag, "\"v2\"");
  EXPECT_FALSE(a->Expired(TimePoint(Seconds(59))));
  EXPECT_TRUE(a->Expired(TimePoint(Seconds(60))));
  EXPECT_EQ(LruOrder(), (Keys{"a", "b"}));  // not an access
  EXPECT_FALSE(index_.Update("missing", [](CacheEntry&) {}));
}

TEST_F(CacheIndexTest, ObjectCanBeQueuedAndOnDiskAtOnce) {
  CacheEntry e = OnDisk(10);
  e.where = Residence::kWriteQueue | Residence::kDisk;
  ASSERT_TRUE(index_.Insert("a", e).ok());
  const CacheEntry* a = index_.Find("a");
  EXPECT_TRUE(a->where.Has(Residence::kWriteQueue));
  EXPECT_TRUE(a->where.Has(Residence::kDisk));
  EXPECT_FALSE(a->where.Has(Residence::kFlashLog));
  EXPECT_EQ(Residences::FromBits(a->where.bits()), a->where);
  EXPECT_FALSE(a->Expired(TimePoint(Seconds(1e6))));  // expiry unknown
}

TEST_F(CacheIndexTest, RestoringInForEachOrderKeepsLruOrderAndTimes) {
  Put("a", 1);
  clock_.AdvanceBy(Seconds(1));
  Put("b", 2);
  clock_.AdvanceBy(Seconds(1));
  Put("c", 3);
  index_.Touch("a");
  std::vector<std::pair<std::string, CacheEntry>> saved;
  index_.ForEach([&](const std::string& k, const CacheEntry& e) { saved.emplace_back(k, e); });

  VirtualClock later(TimePoint(Seconds(100)));
  CacheIndex restored(later, 10);
  for (auto& [k, e] : saved) ASSERT_TRUE(restored.Restore(k, e).ok());
  Keys order;
  restored.ForEach([&](const std::string& k, const CacheEntry& e) {
    order.push_back(k);
    EXPECT_EQ(e.fetched, index_.Find(k)->fetched);
    EXPECT_EQ(e.last_access, index_.Find(k)->last_access);
  });
  EXPECT_EQ(order, (Keys{"b", "c", "a"}));
  EXPECT_EQ(restored.total_bytes(), 6u);
}

}  // namespace
}  // namespace ghost
