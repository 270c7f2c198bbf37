// FindAppended: is a message we may have APPENDed already on the server?
//
// APPEND is the one IMAP command in the deferred queues (common/imap/imap_queue.h) that is not
// idempotent: a flag STORE, an EXPUNGE or a MOVE of a UID sent twice does nothing the second
// time, but an APPEND sent twice leaves two copies. A queued APPEND may have reached the server
// without its answer reaching us: the daemon was killed between the server's OK and the
// journal's ack, or the connection dropped (or timed out) after the command went out. Such an
// operation is marked `maybe_applied`, and before it is sent again the mailbox is searched
// for it: a message with the same bytes (CRs aside: servers store lines with CRLF) and, when
// the APPEND gave one, the same INTERNALDATE, which the APPEND set to the second the reader
// delivered the message. Candidates are found by Message-ID (UID SEARCH HEADER), or, for a
// message without one, by the server among the messages of the days around its INTERNALDATE
// (UID SEARCH SINCE/BEFORE: ImapClient::UidSearchNearDate); only their summaries are fetched
// (UID FETCH of those UIDs), filtered by the exact INTERNALDATE, and the newest `kMaxCompared`
// are fetched and compared byte for byte. (An APPEND without a date and without a Message-ID
// leaves every message a candidate: UID FETCH 1:*.)
//
// What this cannot tell apart: the same bytes delivered twice in the same second into the same
// mailbox, while the first copy's APPEND was the one in doubt. The second is then taken for the
// first, and one copy is on the server instead of two. A message another client moved on
// between our lost answer and the search is looked for in the other mailboxes the same way
// (ghostfs's MailTree::FindAppendedElsewhere; a MOVE or COPY keeps the bytes and the
// INTERNALDATE); one another client expunged is appended again.
#ifndef GHOST_COMMON_IMAP_FIND_APPENDED_H_
#define GHOST_COMMON_IMAP_FIND_APPENDED_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/imap/imap_client.h"

namespace ghost {

// The Message-ID header of an RFC 5322 message ("" if it has none): unfolded, trimmed.
std::string MessageIdOf(std::string_view msg);

// Runs `step` once the mailbox to search is the client's selected one (`step(Status)` with an
// error when it cannot be selected). Called before each command, because a caller that shares
// the connection between mailboxes (ghostfs's mail tree) may select another mailbox between
// two of them.
using InMailbox = std::function<void(std::function<void(Status)> step)>;

inline constexpr int kMaxCompared = 8;

// `done(uid)`: the UID of the message found in the mailbox, 0 when it is not there; an error
// when the server could not be asked (the caller keeps the APPEND queued).
void FindAppended(ImapClient& client, std::shared_ptr<const std::string> body, std::int64_t internaldate,
                  InMailbox in_mailbox, std::function<void(Result<std::uint32_t>)> done);

// An APPEND in doubt that FindAppended did not find in its own mailbox: another client may
// have moved it on since (MOVE and COPY keep the bytes and the INTERNALDATE). Looks for it the
// same way in each of `mailboxes` in turn (`select(wire, step)` makes `wire` the client's
// selected mailbox, then runs `step`). `done` gets the wire name of the first that holds it, ""
// when none does or when the APPEND set no INTERNALDATE (then an older copy of the same bytes,
// which another client copied there, could not be told from ours: not searched, the message is
// appended again, a duplicate, never a loss), or the error that kept the server from being asked.
using SelectMailbox = std::function<void(const std::string& wire, std::function<void(Status)> step)>;
void FindAppendedIn(ImapClient& client, std::shared_ptr<const std::string> body, std::int64_t internaldate,
                    std::vector<std::string> mailboxes, SelectMailbox select,
                    std::function<void(Result<std::string>)> done);

}  // namespace ghost

#endif  // GHOST_COMMON_IMAP_FIND_APPENDED_H_
