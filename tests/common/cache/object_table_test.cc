#include "common/cache/object_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace ghost {
namespace {

TEST(ObjectTableTest, PutGetTouchEraseKeepCountAndBytes) {
  ObjectTable t;
  EXPECT_FALSE(t.Put(7, 100, 1).has_value());
  EXPECT_FALSE(t.Put(9, 50, 2).has_value());
  EXPECT_EQ(t.Put(7, 30, 3), std::optional<Bytes>(100));  // replaced: old size back
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.total_bytes(), 80u);
  ASSERT_NE(t.Get(7), nullptr);
  EXPECT_EQ(t.Get(7)->tick, 3);
  EXPECT_TRUE(t.Touch(9, 10));
  EXPECT_EQ(t.Get(9)->tick, 10);
  EXPECT_FALSE(t.Touch(8, 10));
  EXPECT_TRUE(t.Erase(7));
  EXPECT_FALSE(t.Erase(7));
  EXPECT_EQ(t.Get(7), nullptr);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.total_bytes(), 50u);
  t.AssertInvariants();
}

TEST(ObjectTableTest, RandomOperationsMatchAMapThroughGrowthAndBackwardShiftDeletes) {
  ObjectTable t;
  std::map<std::uint64_t, Bytes> model;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200000; ++i) {
    // A small key space keeps clusters full of collisions and deletes.
    std::uint64_t h = (rng() % 5000) * 0x9e3779b97f4a7c15ull + 1;
    if (rng() % 3 == 0) {
      EXPECT_EQ(t.Erase(h), model.erase(h) == 1);
    } else {
      Bytes size = rng() % 1000;
      t.Put(h, size, i);
      model[h] = size;
    }
  }
  t.AssertInvariants();
  ASSERT_EQ(t.size(), model.size());
  Bytes total = 0;
  for (auto [h, size] : model) {
    ASSERT_NE(t.Get(h), nullptr);
    EXPECT_EQ(t.Get(h)->size, size);
    total += size;
  }
  EXPECT_EQ(t.total_bytes(), total);
}

TEST(ObjectTableTest, VictimIsTheLeastRecentlyUsedWhenSmallExceptTheKeptOne) {
  ObjectTable t;
  for (std::uint64_t h = 1; h <= 100; ++h) t.Put(h * 977, 1, static_cast<std::int64_t>(200 - h));
  // Ticks: h=100 has the lowest (100).
  EXPECT_EQ(t.PickVictim(0)->hash, 100u * 977);
  EXPECT_EQ(t.PickVictim(100u * 977)->hash, 99u * 977);
  ObjectTable empty;
  EXPECT_FALSE(empty.PickVictim(0).has_value());
}

TEST(ObjectTableTest, SampledVictimIsAmongTheOldestObjects) {
  ObjectTable t;
  constexpr int kN = 100000;
  for (int i = 0; i < kN; ++i) t.Put(static_cast<std::uint64_t>(i) * 0x9e3779b97f4a7c15ull + 1, 1, i);
  // 32 samples: the victim's tick is below the 20th percentile with probability 1 - 0.8^32.
  for (int round = 0; round < 50; ++round) {
    std::optional<ObjectTable::Slot> v = t.PickVictim(0);
    ASSERT_TRUE(v.has_value());
    EXPECT_LT(v->tick, kN / 5);
    t.Erase(v->hash);
  }
  t.AssertInvariants();
}

TEST(ObjectTableTest, CostsAtMostFortyOneBytesPerObject) {
  ObjectTable t;
  for (std::uint64_t i = 1; i <= 1000000; ++i) t.Put(i * 0x9e3779b97f4a7c15ull, 512, 0);
  EXPECT_LE(t.memory_bytes() / t.size(), 41u);
}

// A clean Open loads the objects in hash order (from the covering index): ascending hashes
// must not pile up in one cluster (they did with an unmixed home slot: quadratic probing, 9 s to
// load 100k objects, minutes for a million).
TEST(ObjectTableTest, AscendingHashesLoadWithoutLongProbeClusters) {
  ObjectTable table;
  constexpr std::uint64_t kN = 50'000;
  const std::uint64_t step = ~std::uint64_t{0} / kN;
  for (std::uint64_t i = 1; i <= kN; ++i) table.Put(i * step, 512, static_cast<std::int64_t>(i));
  EXPECT_EQ(table.size(), kN);
  EXPECT_LT(table.probe_steps(), 20 * kN) << "inserts probed far past their home slots";
  EXPECT_LT(table.LongestProbe(), 200u);
  table.AssertInvariants();
}

}  // namespace
}  // namespace ghost
