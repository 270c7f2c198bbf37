// MemoryCache: the proxy's copies of responses in RAM (proxy/memory_cache.h).
#include "proxy/memory_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace ghost {
namespace {

std::shared_ptr<const MemoryObject> Object(std::size_t size, char fill = 'x') {
  auto o = std::make_shared<MemoryObject>();
  o->head.status = 200;
  o->head.headers = {{"Content-Type", "application/octet-stream"}};
  o->head.size = size;
  o->body.assign(size, fill);
  return o;
}

// Room for `n` objects of `size` bytes under key "k<i>" (charges are equal for equal keys).
Bytes RoomFor(int n, std::size_t size) {
  return static_cast<Bytes>(n) * MemoryCache::Charge("k0", *Object(size));
}

class MemoryCacheTest : public ::testing::Test {};

TEST_F(MemoryCacheTest, FindsWhatWasInsertedWithItsBytes) {
  MemoryCache cache(1 << 20);
  ASSERT_TRUE(cache.Insert("k0", Object(1000, 'a')));
  std::shared_ptr<const MemoryObject> o = cache.Find("k0");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->body, std::string(1000, 'a'));
  EXPECT_EQ(o->head.size, 1000u);
  EXPECT_EQ(cache.Find("other"), nullptr);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.bytes(), MemoryCache::Charge("k0", *o));
}

TEST_F(MemoryCacheTest, EvictsLeastRecentlyUsedToStayUnderTheByteCap) {
  MemoryCache cache(RoomFor(3, 1000));
  ASSERT_TRUE(cache.Insert("k0", Object(1000)));
  ASSERT_TRUE(cache.Insert("k1", Object(1000)));
  ASSERT_TRUE(cache.Insert("k2", Object(1000)));
  ASSERT_NE(cache.Find("k0"), nullptr);  // k1 is now the least recently used
  ASSERT_TRUE(cache.Insert("k3", Object(1000)));
  EXPECT_EQ(cache.Find("k1"), nullptr);
  EXPECT_NE(cache.Find("k0"), nullptr);
  EXPECT_NE(cache.Find("k2"), nullptr);
  EXPECT_NE(cache.Find("k3"), nullptr);
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_LE(cache.bytes(), cache.capacity());
  EXPECT_EQ(cache.stats().evictions, 1u);
}

TEST_F(MemoryCacheTest, NeverHoldsMoreBytesThanItsCapacity) {
  const Bytes cap = 64 * 1024;
  MemoryCache cache(cap);
  for (int i = 0; i < 200; ++i) {
    cache.Insert("key" + std::to_string(i),
                 Object(static_cast<std::size_t>(100 + (i * 977) % 9000)));
    ASSERT_LE(cache.bytes(), cap) << "after insert " << i;
  }
  EXPECT_GT(cache.size(), 0u);
  EXPECT_GT(cache.stats().evictions, 0u);
}

TEST_F(MemoryCacheTest, ReplacingAKeyKeepsOnlyTheNewObject) {
  MemoryCache cache(1 << 20);
  ASSERT_TRUE(cache.Insert("k0", Object(100, 'a')));
  ASSERT_TRUE(cache.Insert("k0", Object(200, 'b')));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Find("k0")->body, std::string(200, 'b'));
  EXPECT_EQ(cache.bytes(), MemoryCache::Charge("k0", *Object(200)));
}

TEST_F(MemoryCacheTest, EraseDropsAnInvalidatedObject) {
  MemoryCache cache(1 << 20);
  ASSERT_TRUE(cache.Insert("k0", Object(100)));
  ASSERT_TRUE(cache.Insert("k1", Object(100)));
  EXPECT_TRUE(cache.Erase("k0"));
  EXPECT_FALSE(cache.Erase("k0"));
  EXPECT_EQ(cache.Find("k0"), nullptr);
  EXPECT_NE(cache.Find("k1"), nullptr);
  EXPECT_EQ(cache.bytes(), MemoryCache::Charge("k1", *Object(100)));
  cache.Clear();
  EXPECT_EQ(cache.Find("k1"), nullptr);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_EQ(cache.size(), 0u);
}

TEST_F(MemoryCacheTest, CapacityZeroKeepsNothing) {
  MemoryCache cache(0);
  EXPECT_FALSE(cache.Insert("k0", Object(10)));
  EXPECT_EQ(cache.Find("k0"), nullptr);
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST_F(MemoryCacheTest, RefusesObjectsOverTheObjectLimitAndDropsTheOldCopy) {
  MemoryCache cache(64 << 20);
  ASSERT_EQ(cache.max_object(), MemoryCache::kMaxObject);
  ASSERT_TRUE(cache.Insert("big", Object(1000)));
  EXPECT_FALSE(cache.Insert("big", Object(static_cast<std::size_t>(MemoryCache::kMaxObject) + 1)));
  EXPECT_EQ(cache.Find("big"), nullptr);  // the older, smaller copy is not served instead
  MemoryCache small(4000);
  EXPECT_EQ(small.max_object(), 1000u);  // a quarter of the capacity
  EXPECT_FALSE(small.Insert("k", Object(1001)));
}

TEST_F(MemoryCacheTest, RefusesABodyWhoseLengthDiffersFromItsHead) {
  MemoryCache cache(1 << 20);
  auto o = std::make_shared<MemoryObject>();
  o->head.size = 10;
  o->body = "short";
  EXPECT_FALSE(cache.Insert("k0", o));
  EXPECT_EQ(cache.Find("k0"), nullptr);
}

TEST_F(MemoryCacheTest, AnEvictedObjectStaysValidWhileStillReferenced) {
  MemoryCache cache(RoomFor(4, 1000));
  ASSERT_TRUE(cache.Insert("k0", Object(1000, 'a')));
  std::shared_ptr<const MemoryObject> held = cache.Find("k0");
  for (int i = 1; i <= 4; ++i)
    ASSERT_TRUE(cache.Insert("k" + std::to_string(i), Object(1000, 'b')));
  EXPECT_EQ(cache.Find("k0"), nullptr);  // evicted
  EXPECT_EQ(held->body, std::string(1000, 'a'));
}

}  // namespace
}  // namespace ghost
