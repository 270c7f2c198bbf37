#include "common/cache/cache_manager.h"

#include <vector>

namespace ghost {

const char* ReadSourceName(ReadSource s) {
  switch (s) {
    case ReadSource::kMemory:
    case ReadSource::kWriteQueue: return "memory";
    case ReadSource::kFlash: return "flash";
    case ReadSource::kDisk: return "disk";
    case ReadSource::kNetwork: return "network";
    case ReadSource::kRevalidate: return "revalidate";
    case ReadSource::kStale: return "stale";
  }
  return "?";
}

CacheManager::CacheManager(const Clock& clock, Machine& machine, Options options)
    : clock_(clock), machine_(machine), options_(options), page_cache_(std::make_unique<CacheIndex>(clock, options.page_cache)) {}

ReadDecision CacheManager::DecideRead(const ObjectState& state) {
  ReadDecision d = Decide(state);
  if (observer_) observer_(state, d);
  return d;
}

ReadDecision CacheManager::Decide(const ObjectState& state) {
  ReadDecision d;
  if (!state.on_disk) {
    if (state.in_write_queue) {
      d.source = ReadSource::kWriteQueue;
    } else {
      d.source = ReadSource::kNetwork;
      d.queue_fill = true;
    }
    return d;
  }
  if (!state.fresh) {
    d.source = ReadSource::kRevalidate;
    return d;
  }
  std::vector<Holder> holders;
  if (state.in_memory) holders.push_back({Source::kMemory, -1});
  holders.push_back({Source::kDisk, machine_.storage_id()});
  holders.push_back({Source::kNetwork, machine_.network_id()});
  d.costed = true;
  CostModel& cost = machine_.cost();
  if (machine_.adaptive()) {
    d.choice = cost.Choose(holders, state.size);
  } else {
    // The paper's unmodified cache: the first local copy, whatever it costs. The estimates
    // are still filled in for user.ghost.cost.
    for (const Holder& h : holders) d.choice.candidates.push_back(cost.Estimate(h, state.size));
    d.choice.chosen = d.choice.candidates.front();
    d.choice.ideal = d.choice.chosen;
  }
  switch (d.choice.chosen.holder.source) {
    case Source::kMemory: d.source = ReadSource::kMemory; break;
    case Source::kFlash: d.source = ReadSource::kFlash; break;
    case Source::kDisk: d.source = ReadSource::kDisk; break;
    case Source::kNetwork: d.source = ReadSource::kNetwork; break;
  }
  return d;
}

void CacheManager::Remember(const std::string& key, Bytes size) {
  if (options_.page_cache == 0 || size == 0 || size > options_.page_cache) return;
  CacheEntry e;
  e.size = size;
  e.where = Residence::kMemory;
  (void)page_cache_->Insert(key, e);  // evicts the least recently used copies
}

std::size_t CacheManager::ForgetMemory() {
  std::size_t n = page_cache_->size();
  page_cache_ = std::make_unique<CacheIndex>(clock_, options_.page_cache);
  return n;
}

}  // namespace ghost
