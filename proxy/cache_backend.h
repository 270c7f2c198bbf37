// CacheBackend: what ghostproxy needs from the cache it shares with ghostfs (DESIGN §3.4, §4).
//
// The proxy speaks HTTP and decides what is cacheable (RFC 9111); the backend keeps the
// objects and makes the power-aware choices. The product's backend is GhostfsBackend
// (proxy/ghostfs_backend.h): the running ghostfs daemon's cache store, reached through its
// control socket (lookups, cost-model choices, hints) and its mount (bodies are read from and
// written into MOUNTPOINT/.ghost/, so fills go through the daemon's deferred write queue).
// Tests use MemoryBackend (tests/proxy/memory_backend.h).
//
// Keys are opaque strings chosen by the proxy: the absolute URL, or the URL plus the values
// of the request headers named by the stored response's Vary (UrlKey and VariantKey in
// proxy/cache_policy.h).
//
// Asynchronous: every callback runs later on the proxy's event loop, never inside the call
// that took it, exactly once (unless the backend is destroyed first: then never).
#ifndef GHOST_PROXY_CACHE_BACKEND_H_
#define GHOST_PROXY_CACHE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

// A response as stored: status, the end-to-end header fields (hop-by-hop ones removed) and
// the body's length. The proxy serializes it; the backend keeps it verbatim.
struct StoredResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  Bytes size = 0;
  // Unix seconds: when the response was received (RFC 9111 §4.2.3 response_time), and when
  // it stops being fresh (nullopt: the proxy computes freshness from the headers).
  std::int64_t stored_unix = 0;
  std::optional<std::int64_t> expires_unix;
};

// Where the cost model says a cached object should come from right now. kMemory: a copy this
// process holds in RAM (CacheBackend::FindInMemory), which needs no device and so always
// costs least (DESIGN §3.4).
enum class CacheChoice { kDisk, kNetwork, kMemory };

// A stored response held in RAM: its head as stored and its whole body (body.size() ==
// head.size). Immutable once shared.
struct MemoryHitMemo;  // ghostproxy's (proxy/proxy_internal.h)
struct MemoryObject {
  StoredResponse head;
  std::string body;
  // What ghostproxy derives from `head` at every hit, kept by it on the first hit (the parsed
  // freshness fields, the response head written out). Not part of the value: set only on the
  // proxy's event-loop thread, never changes `head` or `body`.
  mutable std::shared_ptr<const MemoryHitMemo> memo;
};

struct CacheLookup {
  bool cached = false;
  StoredResponse response;              // when cached
  CacheChoice choice = CacheChoice::kDisk;  // when cached: the cheaper source now
  bool ghost_hint = false;              // the choice sent the disk a ghost hint
  std::shared_ptr<const MemoryObject> memory;  // with kMemory: the copy to serve
  // When cached: the backend's hold on the one version of the body this lookup describes
  // (opaque to the proxy). Passed to every ReadBody of the exchange, it keeps the slices to
  // that version, even when the object is replaced or evicted meanwhile. May be empty.
  std::shared_ptr<const void> body;
  // LookupForFetch's miss: the transfer begun for the fetch that follows (TransferBegin's id).
  // The caller owns it: it fetches with it, or ends it (TransferEnd).
  std::optional<std::uint64_t> transfer;
};

// Receives one body being stored. Write calls are ordered; Commit makes the object visible
// (atomically: a reader sees the old object or the new one, never half of one); Abort, or
// destroying the writer without Commit, discards it.
class CacheWriter {
 public:
  virtual ~CacheWriter() = default;
  virtual void Write(std::string data) = 0;
  virtual void Commit(std::function<void(Status)> done) = 0;
  virtual void Abort() = 0;
  // The fetch that brought this body is over: instead of the caller's TransferEnd, a writer
  // that can end `transfer` together with its commit takes it (true) and ends it then (or at
  // Abort, or when destroyed uncommitted). False: the caller ends it.
  virtual bool TakeTransferEnd(std::uint64_t transfer) {
    (void)transfer;
    return false;
  }
};

class CacheBackend {
 public:
  virtual ~CacheBackend() = default;

  // Looks `key` up and, if it is cached, asks the cost model where to read it from (sending
  // the disk a ghost hint when the network wins although its ideal mode would not have).
  virtual void Lookup(const std::string& key, std::function<void(Result<CacheLookup>)> done) = 0;
  // Lookup for a request that is fetched from the origin if it misses: a miss also begins that
  // fetch's transfer (CacheLookup::transfer), which a backend may fold into the lookup's own
  // round trip.
  virtual void LookupForFetch(const std::string& key, std::function<void(Result<CacheLookup>)> done) {
    Lookup(key, [this, done = std::move(done)](Result<CacheLookup> r) {
      if (r.ok() && !r->cached) r->transfer = TransferBegin();
      done(std::move(r));
    });
  }

  // The knob K of the daemon whose cache this is, as it last said (download shaping decides
  // with it, proxy/shaper.h); nullopt while unknown. The default backend has no daemon.
  virtual std::optional<int> DaemonKnob() const { return std::nullopt; }

  // A shaped download's card naps (DESIGN §3.6 rules 2–5; the daemon's "nap" op): the burst
  // ended and the next is due `due_in` from now on a path of minimum RTT `min_rtt`; the card
  // should be awake `wake_lead` before it. `done(napping, slow_wake)` says whether the daemon's
  // emulated card naps, and whether it refused because it wakes too slowly for this round
  // trip (rule 4: asking again for this download is pointless); it may never run (no daemon,
  // a lost connection). NapEnd: the card must be awake now. The default backend has no card.
  virtual void NapBegin(Duration due_in, Duration min_rtt, Duration wake_lead,
                        std::function<void(bool napping, bool slow_wake)> done) {
    (void)due_in, (void)min_rtt, (void)wake_lead, (void)done;
  }
  virtual void NapEnd() {}

  // What the daemon pushes, from the backend's one subscription on its control connection
  // ("stats", "modes", "events"): the knob for download shaping (DaemonKnob) and for the mail
  // proxies' NetworkWatch, the network card's modes and `ghostctl flush` for the latter. One
  // subscription for the whole proxy, so every part sees a knob change from the same event.
  struct DaemonListener {
    // The knob when first known (at WatchDaemon if it is known then) and at every change.
    std::function<void(int knob)> on_knob;
    // The "devices" array: baseline (true) as read at subscription (also given at WatchDaemon
    // if known), then each "modes" event's data (false).
    std::function<void(const nlohmann::json& devices, bool baseline)> on_modes;
    // An "events" event's data ({"type":"flush"} from `ghostctl flush`).
    std::function<void(const nlohmann::json& data)> on_event;
    // The control connection dropped: subscriptions are gone, events may have been missed.
    std::function<void()> on_lost;
  };
  // Adds a listener; returns its id for UnwatchDaemon, or 0 when this backend has no daemon
  // (the default). The callbacks run on the loop, never inside WatchDaemon except for the
  // state already known (on_knob, on_modes with baseline true).
  virtual std::uint64_t WatchDaemon(DaemonListener listener) {
    (void)listener;
    return 0;
  }
  virtual void UnwatchDaemon(std::uint64_t id) { (void)id; }

  // The copy of `key` this process holds in RAM, if any (synchronous: a memory hit costs no
  // round trip). Its freshness is the caller's to judge, as for any stored response. The
  // default backend holds none.
  virtual std::shared_ptr<const MemoryObject> FindInMemory(const std::string& key) {
    (void)key;
    return nullptr;
  }
  // A response was served from FindInMemory's copy of `key` (`bytes` of its body): the
  // backend reports it to the cache's owner as a read from memory.
  virtual void ServedFromMemory(const std::string& key, Bytes bytes) {
    (void)key;
    (void)bytes;
  }

  // Streams bytes [offset, offset + length) of a cached body: `on_data` gets them in order
  // (return false to stop early), then `done` once. `body` is the lookup's CacheLookup::body:
  // the bytes then come from that version only. Without it, an object evicted meanwhile is
  // an error.
  virtual void ReadBody(const std::string& key, const std::shared_ptr<const void>& body,
                        Bytes offset, Bytes length,
                        std::function<bool(std::string_view)> on_data,
                        std::function<void(Status)> done) = 0;

  // Starts storing `head` (and then its body) under `key`, replacing what is there.
  virtual std::unique_ptr<CacheWriter> Store(const std::string& key, const StoredResponse& head) = 0;

  // A 304 refreshed a stored response: replaces its header fields and freshness, keeps the body.
  virtual void Refresh(const std::string& key, const StoredResponse& head) = 0;

  // Removes `key` (a response that may no longer be stored, RFC 9111 §4.4).
  virtual void Invalidate(const std::string& key) = 0;

  // A network transfer, disclosed to the power manager (DESIGN §3.3) and carried by the
  // backend's (emulated) network card: begin before the request goes out (returns the
  // transfer's id); TransferData once the response body's size is known, whose `done` runs when
  // the card has carried that many bytes (the client's last byte waits for it, DESIGN §7); end
  // when the response is complete (or failed). TransferData at most once per transfer.
  virtual std::uint64_t TransferBegin() = 0;
  virtual void TransferData(std::uint64_t transfer, Bytes body_bytes,
                            std::function<void()> done) = 0;
  virtual void TransferEnd(std::uint64_t transfer, Bytes bytes) = 0;
  // TransferData for bytes sent to the origin (an IMAP APPEND's message): the card carries them
  // at the link's upload rate. A backend without an upload direction charges them as a download.
  virtual void TransferUpload(std::uint64_t transfer, Bytes bytes, std::function<void()> done) {
    TransferData(transfer, bytes, std::move(done));
  }
};

}  // namespace ghost

#endif  // GHOST_PROXY_CACHE_BACKEND_H_
