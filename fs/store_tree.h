// StoreTree: the shared store MOUNTPOINT/.ghost/, through which ghostproxy uses this daemon's
// cache, and the control operations that go with it (lookup, store, refresh, invalidate,
// transfer, served). The rules are at the top of store_tree.cc.
//
// Its objects are read through the origin tree's read path (fs/origin_tree.h), so a proxy's
// read and a mount's read of one body take the same steps.
//
// Thread-safety: the daemon's one event-loop thread.
#ifndef GHOST_FS_STORE_TREE_H_
#define GHOST_FS_STORE_TREE_H_

#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/cache/cache_index.h"
#include "common/control/control.h"
#include "fs/tree.h"

namespace ghost {

class OriginTree;
struct Handle;

// .ghost/ entries change only through the control socket: short attribute timeouts.
constexpr double kStoreAttrTimeout = 0.0;

// A body the proxy is handing over through .ghost/fill/<token>.
struct StoreFill {
  std::string key;
  CacheEntry meta;
  std::string data;
  bool handed_over = false;
};

// A proxy's fetch that the emulated card carries (the "transfer" control op).
struct ProxyTransfer {
  std::uint64_t connection = 0;  // the control connection that began it (0: none)
  bool data_sent = false;
  int data_pending = 0;  // "data" I/Os the card has not finished
  bool ended = false;    // "end" came: the transfer closes once the data is through
};

struct StoreStats {
  std::uint64_t lookups = 0, hits = 0, network_preferred = 0, fills = 0, refreshes = 0;
  std::uint64_t memory_hits = 0;  // reads a client served from its own RAM copy ("served")
  std::uint64_t orphaned_transfers = 0;  // ended because their connection closed
  std::uint64_t inline_fills = 0;  // of `fills`, those whose body came in the "store" request
  std::uint64_t held = 0;  // store/refresh/invalidate requests held while the fill backlog was full
};

class StoreTree final : public Tree {
 public:
  // `ctx` and `reads` (the read path its objects are read through) are borrowed: they must
  // outlive the tree.
  StoreTree(TreeContext ctx, OriginTree& reads);
  StoreTree(const StoreTree&) = delete;
  StoreTree& operator=(const StoreTree&) = delete;

  // .ghost/ itself, as the root's entry ".ghost".
  void LookupRoot(fuse_req_t req);

  // ---- Tree: nodes of NodeKind::kStoreDir, kStoreObject and kStoreFill ----
  void Lookup(fuse_req_t req, Node* parent, const char* name) override;
  void Getattr(fuse_req_t req, Node* n) override;
  // Only a fill's truncation to 0 (an O_TRUNC open) is taken: EROFS for anything else.
  void Setattr(fuse_req_t req, Node* n, struct stat* attr, int to_set, fuse_file_info* fi) override;
  void Readdir(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) override;
  void Open(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Read(fuse_req_t req, Node* n, size_t size, off_t off, fuse_file_info* fi) override;
  void Write(fuse_req_t req, Node* n, const char* buf, size_t size, off_t off, fuse_file_info* fi) override;
  void Flush(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Release(fuse_req_t req, Node* n, fuse_file_info* fi) override;
  void Unlink(fuse_req_t req, Node* parent, const char* name) override;

  // ---- control operations (common/control/protocol.h) ----
  // lookup, store, refresh, invalidate, transfer, served; replies exactly once.
  void Control(const ControlRequest& request, ControlServer::Reply reply);
  // A control connection closed (ControlServer::SetCloseHandler): the transfers it began and
  // did not end are ended now, as if it had sent their "end" (the card's data already given
  // still finishes first). A proxy killed, or stopped, between a transfer's begin and its end
  // would otherwise leave it open for the daemon's life, and the network card's power policy,
  // which sees an open disclosed transfer as activity, would start no new run, sample no gap
  // and never arm its idle timer again: hints could not switch the card to CAM any more, nor
  // would it return to PSM (ghostproxy_smtp check 14 under load, round 18).
  void ConnectionClosed(std::uint64_t connection);
  // For `ghostctl stats` ("proxy").
  nlohmann::json StatsJson() const;

 private:
  std::string StoreName(const std::string& key) const;
  struct stat StoreStat(const Node* n) const;
  const std::string* StoreKey(const std::string& name) const;
  std::string StoreVersion(const std::string& key) const;
  void StoreHandOver(Handle& h);
  void QueueStoreFill(const std::string& key, CacheEntry meta, std::string data);
  // The control ops, one handler each (Control's table).
  void ControlLookup(const ControlRequest& request, ControlServer::Reply reply);
  void ControlStore(const ControlRequest& request, ControlServer::Reply reply);
  void ControlRefresh(const ControlRequest& request, ControlServer::Reply reply);
  void ControlInvalidate(const ControlRequest& request, ControlServer::Reply reply);
  void ControlTransfer(const ControlRequest& request, ControlServer::Reply reply);
  void ControlServed(const ControlRequest& request, ControlServer::Reply reply);
  // Answers a lookup of `key` with a LookupResult (waits for a fill of it being written).
  // `begin_transfer`: a miss begins the fetch's transfer, owned by `connection`, and answers
  // its id (lookup's "begin_transfer").
  void LookupObject(const std::string& key, ControlServer::Reply reply, bool begin_transfer = false,
                    std::uint64_t connection = 0);
  // A miss's answer; with `begin_transfer`, the transfer begun for its fetch (owned by
  // `connection`) in it, unless nobody waits for the answer any more (`reply` not pending: its
  // client has gone, and nobody would end the transfer).
  nlohmann::json MissJson(bool begin_transfer, std::uint64_t connection, const ControlServer::Reply& reply);
  void StoreTransfer(const TransferArgs& args, std::uint64_t connection, ControlServer::Reply reply);
  // The phases of a proxy's transfer (the "transfer" op; lookup and store fold begin and end
  // in). Begin returns the id. Data: the card carries `bytes`, then `done` (at once without
  // an emulated card). End: closes after its data. Both return an error text for an unknown
  // id or a second data phase, empty when done.
  // `connection`: the control connection that owns it (ConnectionClosed ends it).
  std::uint64_t BeginProxyTransfer(std::uint64_t connection);
  std::string ProxyTransferData(std::uint64_t id, Bytes bytes, bool upload, std::function<void()> done);
  std::string EndProxyTransfer(std::uint64_t id);

  TreeContext ctx_;
  OriginTree& reads_;
  std::map<std::string, StoreFill> store_fills_;     // by token
  std::map<std::string, std::string> store_keys_;    // .ghost/objects name → key
  std::uint64_t next_store_token_ = 1;
  StoreStats store_stats_;
  std::map<std::uint64_t, ProxyTransfer> proxy_transfers_;  // by id
  std::uint64_t next_transfer_id_ = 1;
  bool objects_published_ = false;  // the store's changes go to the "objects" topic
  std::size_t held_now_ = 0;        // requests waiting for the fill backlog (Control)
};

}  // namespace ghost

#endif  // GHOST_FS_STORE_TREE_H_
