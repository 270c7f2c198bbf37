#include "common/cache/object_table.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace ghost {

std::uint64_t ObjectTable::HashOf(const unsigned char* digest8) {
  std::uint64_t h = 0;
  for (int i = 0; i < 8; ++i) h = (h << 8) | digest8[i];
  return h == 0 ? 1 : h;
}

std::size_t ObjectTable::Probe(std::uint64_t hash) const {
  std::size_t i = Home(hash);
  while (slots_[i].hash != 0 && slots_[i].hash != hash) {
    i = Next(i);
    ++probe_steps_;
  }
  return i;
}

const ObjectTable::Slot* ObjectTable::Get(std::uint64_t hash) const {
  if (count_ == 0) return nullptr;
  const Slot& s = slots_[Probe(hash)];
  return s.hash == hash ? &s : nullptr;
}

void ObjectTable::Grow() {
  std::size_t capacity = slots_.empty() ? 16 : slots_.size() + slots_.size() / 2;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  for (const Slot& s : old) {
    if (s.hash != 0) slots_[Probe(s.hash)] = s;
  }
}

std::optional<Bytes> ObjectTable::Put(std::uint64_t hash, Bytes size, std::int64_t tick) {
  if ((count_ + 1) * 8 > slots_.size() * 7) Grow();
  Slot& s = slots_[Probe(hash)];
  std::optional<Bytes> old;
  if (s.hash == hash) {
    old = s.size;
    total_bytes_ -= s.size;
  } else {
    ++count_;
  }
  s = Slot{hash, size, tick};
  total_bytes_ += size;
  return old;
}

bool ObjectTable::Touch(std::uint64_t hash, std::int64_t tick) {
  if (count_ == 0) return false;
  Slot& s = slots_[Probe(hash)];
  if (s.hash != hash) return false;
  s.tick = tick;
  return true;
}

bool ObjectTable::Erase(std::uint64_t hash) {
  if (count_ == 0) return false;
  std::size_t i = Probe(hash);
  if (slots_[i].hash != hash) return false;
  total_bytes_ -= slots_[i].size;
  --count_;
  // Backward-shift deletion: move later members of the cluster into the hole when the hole
  // lies on their probe path (between their home and where they sit, cyclically).
  std::size_t hole = i;
  for (std::size_t j = Next(i); slots_[j].hash != 0; j = Next(j)) {
    std::size_t home = Home(slots_[j].hash);
    bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  return true;
}

std::optional<ObjectTable::Slot> ObjectTable::PickVictim(std::uint64_t keep) {
  const Slot* best = nullptr;
  auto consider = [&](const Slot& s) {
    if (s.hash != 0 && s.hash != keep && (best == nullptr || Older(s, *best))) best = &s;
  };
  if (count_ <= kExactLimit) {
    for (const Slot& s : slots_) consider(s);
  } else {
    for (int n = 0; n < kSample; ++n) {
      rng_ ^= rng_ << 13;
      rng_ ^= rng_ >> 7;
      rng_ ^= rng_ << 17;
      // The first occupied slot at or after a random position (the table is at least 1/3
      // full above kExactLimit, so this walks a few slots).
      std::size_t i = static_cast<std::size_t>(rng_ % slots_.size());
      while (slots_[i].hash == 0) i = Next(i);
      consider(slots_[i]);
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

void ObjectTable::ForEach(const std::function<void(const Slot&)>& fn) const {
  for (const Slot& s : slots_) {
    if (s.hash != 0) fn(s);
  }
}

std::size_t ObjectTable::LongestProbe() const {
  std::size_t longest = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].hash == 0) continue;
    std::size_t home = Home(slots_[i].hash);
    std::size_t d = i >= home ? i - home : i + slots_.size() - home;
    longest = std::max(longest, d);
  }
  return longest;
}

void ObjectTable::AssertInvariants() const {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "ghost: object table: broken invariant: %s\n", what);
    std::abort();
  };
  std::size_t n = 0;
  Bytes total = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].hash == 0) continue;
    ++n;
    total += slots_[i].size;
    if (Probe(slots_[i].hash) != i) fail("a slot is unreachable from its home");
  }
  if (n != count_) fail("count does not match the slots");
  if (total != total_bytes_) fail("total_bytes does not match the slots");
}

}  // namespace ghost
