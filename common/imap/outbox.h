// Outbox: the durable journal of outgoing mail that waits for the radio (DESIGN §3.3:
// deferred writes, here deferred network transfers). ghostproxy's SMTP submission listener
// (proxy/smtp_proxy.h) puts each accepted message here before it answers 250, and removes it
// once the server took it; `ghostctl outbox` lists the directory.
//
// Layout of DIR:
//   tmp/                 messages being written (left-overs are removed at Open)
//   msg/ID.eml, ID.json  waiting: the message as submitted, and its envelope (JSON: id, from,
//                        rcpts, user, size, received_unix); ID.json is renamed in last, so an
//                        .eml without its .json is an incomplete put (removed at Open)
//   refused/ID.*         refused by the server (a 5xx): kept, never dropped; the .json has
//                        "reply" with the server's answer
// Each file is fsync'ed before its rename and the directory after it: Put returning OK means the
// message survives a crash or a power cut.
//
// Thread-safety: not thread-safe; one owner (the proxy's loop). DataPath may be read by another
// thread while the message is not removed or refused.
#ifndef GHOST_COMMON_IMAP_OUTBOX_H_
#define GHOST_COMMON_IMAP_OUTBOX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/status.h"
#include "common/base/units.h"

namespace ghost {

struct OutboxMessage {
  std::string id;
  std::string from;                 // the reverse path (may be empty: a bounce)
  std::vector<std::string> rcpts;
  std::string user;                 // who submitted it (AUTH), empty without AUTH
  Bytes size = 0;
  std::int64_t received_unix = 0;
  bool refused = false;
  std::string reply;                // refused: the server's answer
  nlohmann::json ToJson() const;
};

class Outbox {
 public:
  // Opens (creating) DIR and reads what waits there. Fails when DIR cannot be created or read.
  [[nodiscard]] static Result<std::unique_ptr<Outbox>> Open(const std::string& dir);

  // Journals a message durably; returns it with its id. Fails (kIoError naming the file) when
  // it cannot be written; then nothing is kept.
  [[nodiscard]] Result<OutboxMessage> Put(const std::string& from, const std::vector<std::string>& rcpts,
                                          const std::string& user, const std::string& data);
  // The server took it: removed.
  [[nodiscard]] Status Remove(const std::string& id);
  // The server refused it for good: moved to refused/ with `reply`.
  [[nodiscard]] Status Refuse(const std::string& id, const std::string& reply);

  const std::vector<OutboxMessage>& waiting() const { return waiting_; }
  Bytes waiting_bytes() const;
  std::string DataPath(const std::string& id) const { return dir_ + "/msg/" + id + ".eml"; }
  const std::string& dir() const { return dir_; }

 private:
  explicit Outbox(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::vector<OutboxMessage> waiting_;
  std::uint64_t counter_ = 0;
};

// What `ghostctl outbox` prints: {"waiting":[...], "refused":[...]} read from DIR, or an error
// naming DIR.
[[nodiscard]] Result<nlohmann::json> ListOutbox(const std::string& dir);

}  // namespace ghost

#endif  // GHOST_COMMON_IMAP_OUTBOX_H_
