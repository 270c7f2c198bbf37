// ImapProxy: ghostproxy as an IMAP proxy for mail clients (DESIGN §3.4: the mail
// application reads each body from the cache or the server by cost).
//
// A client connects to `imap_listen`; the proxy opens one connection to `imap_origin` for it
// and relays both ways. The client logs in with its own credentials (LOGIN or AUTHENTICATE
// PLAIN), which go to the server unchanged: the proxy keeps no password, only the user name
// (for the cache keys). What the proxy does not need to understand passes through unchanged,
// framed by proxy/imap_wire.h (segments and streamed literals, bounded memory).
//
// What it acts on:
//   - CAPABILITY (untagged or as a response code): COMPRESS=, the server's STARTTLS, QRESYNC
//     and AUTH= mechanisms other than PLAIN are removed (imap_wire.h FilterCapabilities);
//     COMPRESS is refused locally. With a certificate (tls_cert/tls_key) the proxy adds its own
//     STARTTLS on a plain session before login, and LOGINDISABLED (no AUTH=) when the plain
//     listener is not a loopback address (TlsCapabilities).
//   - TLS toward clients: imaps_listen sessions start with the TLS handshake (libevent's
//     bufferevent_openssl over the accepted socket); STARTTLS on the plain listener is
//     answered OK once nothing else is outstanding and before login, the client's plaintext
//     after it is dropped (STARTTLS injection), and the session continues on a TLS bufferevent
//     over a duplicate of the socket. A failed handshake closes the session (counted in
//     tls_failures); the upstream connection is the same plain or imaps:// one either way.
//   - A body FETCH of one message (FETCH n / UID FETCH u with BODY[section], BODY.PEEK[section]
//     (partials too) or RFC822, UID besides at most), sent while no other command of the client is outstanding:
//     the body's cache key is the Maildir view's (fs/mail_tree.cc MailTree::BodyKey:
//     ORIGIN-URL-WITH-USER + mailbox + ";UIDVALIDITY=v;UID=u", the origin URL being
//     --imap-origin with "USER@" inserted, so a ghostfs mail origin written as
//     imap://USER@HOST:PORT/ shares its bodies with the proxy). A copy the backend keeps in RAM
//     (FindInMemory: a body once read whole from the disk) answers first, with no round trip
//     to ghostfs, as for HTTP. Otherwise the backend's lookup runs the cost model (a ghost hint when the network wins); on kDisk/kMemory the proxy answers
//     "* seq FETCH ([UID u ]BODY[] {n}" + the cached bytes itself and completes the command
//     with "OK ... (Ghost: from the cache)". A section is located in the whole cached message
//     (read into RAM, up to max_fill; proxy/imap_section.h) and answered the same way; one the
//     locator is not certain of goes to the server. A non-PEEK fetch so answered still marks the
//     message \Seen on the server (UID STORE u +FLAGS (\Seen), whose untagged FETCH FLAGS the
//     client sees). Otherwise the command goes to the server.
//   - Whole bodies the server sends (BODY[] or RFC822 literals, any FETCH) are stored in the
//     cache under that key when not cached yet (bodies up to `max_fill` bytes).
//   - Body fetches forwarded to the server are disclosed to the power manager
//     (TransferBegin/TransferEnd) and carried by ghostfs's emulated card: at the answer's first
//     literal the card is given its size (TransferData), and the FETCH's tagged answer waits
//     until the card has carried it, so the client's last byte waits for both the real bytes
//     and the modelled transfer (as an HTTP fetch's, DESIGN §4.3). An APPEND sent to the server
//     (not deferred) is an upload the same way (TransferUpload of its first message). A body
//     fetch forwarded although cached (the cost model chose the network) is not looked up again
//     to decide whether to store it.
//   - SELECT/EXAMINE, EXISTS, EXPUNGE: the selected mailbox, its UIDVALIDITY and its
//     sequence-number -> UID map (read with "UID SEARCH RETURN (ALL) ALL", ESEARCH, under the
//     proxy's own tag when a body fetch or a deferred change needs it, and kept with EXPUNGE;
//     EXISTS growth or anything unknown makes it stale). The EXISTS and EXPUNGEs that follow
//     the refresh's answer in its own response apply to that answer (dovecot answers from the
//     view of its last sync and announces what arrived since at the command's end): an
//     EXISTS beyond it has it read once more before the waiting command.
//
// Bad input: a line over the limit or a literal announced over `max_literal` from the client
// gets "BAD" and "* BYE" and the connection is closed; from the server the client gets
// "* BYE" and both connections close. Silence in the middle of a line or literal (either
// side), or a server that does not answer an outstanding command other than IDLE, for
// `timeout` closes the session the same way.
//
// Event model: the proxy's libevent loop, callbacks only. Timers exist only as bufferevent
// timeouts while a frame or a command is in progress: an idle session, and a client in IDLE,
// cost no wake-up.
//
//   - Deferred changes (with imap_journal; proxy/imap_deferred.h): while ghostfs's network card
//     is out of its high-power mode, "UID STORE set +FLAGS/-FLAGS[.SILENT] (...)" on messages
//     of the selected mailbox whose UIDs the proxy knows (and, unless .SILENT, whose flags it
//     has seen) is answered here at once (the untagged FETCH FLAGS as they will be) and queued,
//     one operation per message, in the journal. Until the queue is sent, flags the server
//     reports in untagged FETCH responses have the queued changes applied (so FETCH FLAGS
//     agrees with what the client was told), and a command whose answer depends on the flags
//     upstream (SEARCH, SORT, THREAD, COPY, MOVE, STORE not deferred, STATUS, SELECT/EXAMINE
//     of a mailbox with queued changes; EXPUNGE and CLOSE only when a queued change adds or
//     removes \Deleted, as mbsync closes the mailbox after every sync) waits until the queue
//     has been sent, then goes to the server. A cache hit's \Seen is queued the same way.
//     "COPY/UID COPY set MAILBOX" to a mailbox other than the selected one (the set resolved
//     through the map) is queued the same way, one operation per message, and answered OK
//     without COPYUID. "APPEND MAILBOX [(flags)] [date] {n}" (or {n+}) of one message of at most
//     max_deferred_append bytes (to any mailbox, the selected one too): the proxy says "+"
//     itself to a synchronizing literal, reads the message, journals it whole and answers OK
//     without APPENDUID; a MULTIAPPEND's second message gets NO [CANNOT] and nothing is queued.
//     Into the selected mailbox no EXISTS is told: the message joins the client's view when the
//     server reports it after the flush, under the server's UID (DESIGN §4.4 says why no
//     provisional UID). When the server answers a deferred APPEND with APPENDUID, the message
//     is stored in the cache under that UID. A COPY into the selected mailbox goes to the
//     server (its EXISTS and UID can only come from there). A queued copy or append counts as a queued change of its destination
//     (STATUS, SELECT of it send the queue first), and a queued copy as one that touches
//     \Deleted in its source (EXPUNGE, CLOSE send the queue first, so the copy is made before
//     the original goes).
//     EXPUNGE, UID EXPUNGE and CLOSE of the \Deleted messages (when the proxy knows the flags of
//     every message they cover; only those it saw flagged are expunged, as by UID EXPUNGE), and
//     MOVE/UID MOVE to another mailbox, are queued the same way (one kExpunge/kMove operation per
//     message) and answered at once: the untagged EXPUNGEs (none for CLOSE, after which the
//     proxy sends UNSELECT upstream) and OK. The messages then stay "hidden" until the server
//     reports their EXPUNGE (after the queue is sent), and the proxy translates between the
//     client's sequence numbers and the server's: untagged EXISTS, EXPUNGE and FETCH from the
//     server are renumbered (a hidden message's are dropped, so SEARCH and FETCH never show it),
//     a FETCH's sequence set is translated, SEARCH/UID SEARCH answers (criteria without numbers
//     and RETURN, no flag change queued) are renumbered or filtered, UID FETCH answers filtered,
//     UID STORE/COPY deferred against the client's view; every other command waits for the
//     queue and the server's EXPUNGEs (ForwardAfterQueue). If they did not come (the queue could
//     not be sent) the command gets NO [UNAVAILABLE]; if the server refused a deferred expunge
//     the session ends with a BYE, so the client reads the mailbox again (never a wrong
//     answer).
//   - Offline: when the server cannot be reached (refused, unreachable, or silent for
//     `timeout` while connecting), the proxy greets the client itself. A login the server
//     accepted through this proxy before (checked against a salted SHA-256 digest kept in RAM,
//     never the password) is taken; SELECT/EXAMINE of a mailbox a session had open gives its
//     last UID map and flags (kept in RAM); whole-body fetches of cached messages are served
//     from the cache; UID STORE, COPY and APPEND are deferred (with imap_journal); NOOP, CHECK, CAPABILITY,
//     CLOSE, UNSELECT, LOGOUT are answered; everything else, and an uncached body, gets
//     "NO [UNAVAILABLE]" at once. A server lost in the middle of a session still closes it
//     with a BYE.
//
//   - TLS toward the server: imaps:// origins start with the handshake. On an imap:// origin
//     (origin_starttls not "never") the session reads the greeting (and CAPABILITY if the
//     greeting has none) itself before the client is served; when STARTTLS is offered it is
//     sent, and the connection continues on a TLS filter over the socket (server certificate
//     and name verified, as for imaps://). Bytes after the server's STARTTLS OK are refused
//     (injection). The client then gets the greeting without its pre-TLS capabilities. A
//     server without STARTTLS with "required", a refused STARTTLS, or a failed handshake ends
//     the session with a BYE naming the cause. Without TLS, LOGIN/AUTHENTICATE toward a server
//     that is not on a loopback address get NO [PRIVACYREQUIRED] unless origin_plain_login.
//
// Not yet: BINARY[] of the whole
// message from the cache (it passes through; BINARY[n] is answered, imap_section.h); deferred
// EXPUNGE/MOVE offline (NO [UNAVAILABLE]); a user name given as a
// literal (no caching then).
//
// Thread-safety: everything on the thread of the event_base.
#ifndef GHOST_PROXY_IMAP_PROXY_H_
#define GHOST_PROXY_IMAP_PROXY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/base/status.h"
#include "common/base/units.h"
#include "proxy/address.h"
#include "proxy/cache_backend.h"

struct event_base;

namespace ghost {

// The mail proxy's settings (config keys in brackets; see LoadMailProxyConfig).
struct MailProxyOptions {
  // [imap_listen] Where mail clients connect; nullopt: no IMAP proxy.
  std::optional<ListenAddress> imap_listen;
  // [imap_origin] imap://HOST:PORT/ or imaps://HOST:PORT/ (no user: each client's own).
  std::string imap_origin;
  // [imap_max_line] Bytes of one line from a client; a server's lines may be 64 times longer
  // (a SEARCH answer over a large mailbox).
  std::size_t client_max_line = 64 * 1024;
  std::size_t server_max_line = 4 * 1024 * 1024;
  // [imap_max_literal] Bytes one literal may announce (either side).
  Bytes max_literal = 256ull << 20;
  // Bodies the server sends up to this size are stored in the cache.
  Bytes max_fill = 64ull << 20;
  // [imap_timeout] Seconds of silence mid-frame or with a command outstanding.
  Duration timeout = std::chrono::seconds(60);
  // Output waiting for one side above which the other side is not read.
  std::size_t high_watermark = 256 * 1024;
  Bytes cache_read_slice = 256 * 1024;
  // [imap_journal] The deferred changes' journal (proxy/imap_deferred.h); empty: changes are
  // never deferred, they go to the server as the client sends them.
  std::string imap_journal;
  // The largest message a deferred APPEND takes into the journal; a bigger one goes to the
  // server.
  Bytes max_deferred_append = 2ull << 20;
  // [imap_deadline] Seconds a deferred change may wait at knob 50 (scaled by (100 - K) / 50).
  Duration imap_deadline = std::chrono::seconds(60);
  // ghostfs's control socket, for the network card's mode and knob (ghostproxy sets it).
  std::string control_path;
  // [imap_tls_cert] [imap_tls_key] PEM files (the certificate chain, its private key): TLS
  // toward clients. With them the plain listener offers STARTTLS, and refuses logins before it
  // (LOGINDISABLED) unless it listens on a loopback address; without them, no TLS toward
  // clients (both or neither).
  std::string tls_cert, tls_key;
  // [imaps_listen] Where mail clients connect with implicit TLS (IMAPS, RFC 8314); needs the
  // certificate. nullopt: no implicit-TLS listener.
  std::optional<ListenAddress> imaps_listen;
  // [imap_origin_starttls] STARTTLS toward an imap:// origin: "if-offered" (the default: TLS
  // whenever the server offers it, its certificate verified as for imaps://), "required" (a
  // server without it, or whose STARTTLS fails, ends the session with a BYE saying so), or
  // "never". Used by the sessions and by the deferred changes' own connections.
  enum class OriginStartTls { kIfOffered, kRequired, kNever };
  OriginStartTls origin_starttls = OriginStartTls::kIfOffered;
  // [imap_origin_plain_login] Whether a client's LOGIN/AUTHENTICATE may go in clear to an
  // imap:// origin that is not on a loopback address (no STARTTLS). Off: it gets
  // NO [PRIVACYREQUIRED] and the password never leaves the machine in clear.
  bool origin_plain_login = false;
};

struct ImapProxyStats {
  std::uint64_t sessions = 0;
  std::uint64_t cache_hits = 0;        // body fetches answered from the cache
  std::uint64_t forwarded_fetches = 0; // body fetches the proxy could have answered, sent on
  std::uint64_t fills = 0;             // bodies stored in the cache
  std::uint64_t seen_stores = 0;       // \Seen sent for fetches answered from the cache
  std::uint64_t client_errors = 0;     // sessions closed for malformed client input
  std::uint64_t server_errors = 0;     // ... for malformed server input or a stalled server
  std::uint64_t deferred_stores = 0;   // UID STORE commands answered here and queued
  std::uint64_t deferred_copies = 0;   // COPY / UID COPY commands answered here and queued
  std::uint64_t deferred_appends = 0;  // APPEND commands answered here and queued
  std::uint64_t deferred_expunges = 0; // EXPUNGE, UID EXPUNGE, CLOSE, MOVE answered here and queued
  std::uint64_t flushes_before = 0;    // commands that waited for the queue to be sent first
  std::uint64_t section_hits = 0;      // of cache_hits: sections (BODY[HEADER], BODY[1] ...)
  std::uint64_t tls_sessions = 0;      // sessions that started TLS (implicit or STARTTLS)
  std::uint64_t tls_failures = 0;      // TLS handshakes toward clients that failed
  std::uint64_t origin_tls = 0;        // sessions whose server connection went TLS by STARTTLS
  std::uint64_t origin_tls_failures = 0;  // ... that ended because STARTTLS could not be had
};

class ImapProxy {
 public:
  // Listens on options.imap_listen (required). `base` and `backend` are borrowed and must
  // outlive the proxy. Fails on a bad origin URL or when the address cannot be bound.
  [[nodiscard]] static Result<std::unique_ptr<ImapProxy>> Start(event_base* base,
                                                                CacheBackend* backend,
                                                                const MailProxyOptions& options);
  ~ImapProxy();
  ImapProxy(const ImapProxy&) = delete;
  ImapProxy& operator=(const ImapProxy&) = delete;

  const ListenAddress& address() const;
  // The implicit-TLS listener's address (port 0 asked: the one bound); nullopt without one.
  std::optional<ListenAddress> tls_address() const;
  const ImapProxyStats& stats() const;
  // Sends the deferred changes now (SIGUSR1). No-op without imap_journal.
  void Flush(const char* why);

  class Impl;
  explicit ImapProxy(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ghost

#endif  // GHOST_PROXY_IMAP_PROXY_H_
