// DovecotServer: a private dovecot IMAP server on 127.0.0.1, for tests that need a real mail
// origin (TESTING.md "Origins", the dovecot recipe). Each instance runs its own master in the
// foreground as a child of the test (`dovecot -F -c CONF`), with its config, base_dir,
// state_dir, log, password file and the user's home in a fresh temporary directory, on a free
// port; the mail user has a password and owns a Maildir (uid/gid 65534, as the recipe says).
// With Options::tls it also listens for imaps and offers STARTTLS, with a self-signed
// certificate for 127.0.0.1 and "localhost" made by the `openssl` command (cert_path() is the
// CA a client must trust).
//
// Stop() and the destructor stop it (`doveadm -c CONF stop`, then SIGKILL after 5 s) and remove
// its directory, so a failing test cleans up too; if the test process dies, the kernel kills
// the master (PR_SET_PDEATHSIG) and its children follow it.
//
// Use: skip the test when Unavailable() says why dovecot cannot run (not installed, not root:
// dovecot must switch to the mail user), then Start().
//
// Thread-safety: not thread-safe; one owner.
#ifndef GHOST_TESTS_COMMON_DOVECOT_FIXTURE_H_
#define GHOST_TESTS_COMMON_DOVECOT_FIXTURE_H_

#include <sys/types.h>

#include <chrono>

#include <string>
#include <string_view>

#include "common/base/status.h"

namespace ghost {

class DovecotServer {
 public:
  static constexpr const char* kBinary = "/usr/sbin/dovecot";
  static constexpr const char* kDoveadm = "/usr/bin/doveadm";
  static constexpr unsigned kMailUid = 65534;  // the recipe's mail user (nobody:nogroup)

  struct Options {
    std::string user = "ghost";
    std::string password = "s3cret \"quoted\"";  // exercises quoting in LOGIN
    bool tls = false;                            // imaps listener + STARTTLS
    // When set, the capabilities dovecot advertises after login (its imap_capability), e.g.
    // "IMAP4rev1 IDLE" to test a client's fallbacks for MOVE, UIDPLUS and LITERAL+ (the
    // commands still work; a client must not use what is not advertised).
    std::string capabilities;
  };

  DovecotServer() = default;
  ~DovecotServer();
  DovecotServer(const DovecotServer&) = delete;
  DovecotServer& operator=(const DovecotServer&) = delete;

  // Empty if dovecot can be run here; otherwise the reason (for GTEST_SKIP).
  static std::string Unavailable();

  // Writes the config, makes the user's Maildir, starts dovecot and waits (up to 10 s) until it
  // accepts connections. Retries on other ports if a chosen one was taken meanwhile. Fails
  // with dovecot's log in the message. Precondition: not running.
  Status Start(const Options& options);
  Status Start() { return Start(Options{}); }
  // Stops dovecot and removes its directory. Safe to call when not running.
  void Stop();

  bool running() const { return pid_ > 0; }
  const Options& options() const { return options_; }
  int port() const { return port_; }
  int tls_port() const { return tls_port_; }  // 0 without Options::tls
  // "imap://USER@127.0.0.1:PORT/" and "imaps://USER@127.0.0.1:TLS_PORT/" (user
  // percent-encoded).
  std::string url() const;
  std::string imaps_url() const;
  // The self-signed certificate (PEM) clients must trust for TLS; "" without Options::tls.
  std::string cert_path() const;
  // The user's Maildir root (INBOX), e.g. /tmp/ghost-dovecot-XXXXXX/home/Maildir.
  std::string maildir() const;
  std::string ReadLog() const;
  // dovecot's log once it holds `text` (its log process writes after the session moved on),
  // or as it is after `timeout`.
  std::string WaitForLog(std::string_view text, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  // Creates the Maildir++ folder `folder` (".Name", see common/imap/maildir_names.h) with cur/,
  // new/ and tmp/, owned by the mail user. Succeeds if it exists already.
  Status CreateFolder(const std::string& folder);
  // Delivers `contents` as one message file into `folder` ("" for INBOX, ".Name" for a
  // folder, created if missing), the Maildir way: written in tmp/, then renamed into cur/ with
  // info ":2,<info>" or, with `into_new`, into new/ (what a local delivery agent does).
  // Returns the file's path. Files are owned by the mail user.
  Result<std::string> Seed(const std::string& folder, const std::string& contents,
                           const std::string& info = "", bool into_new = false);

 private:
  Status SpawnOnce(int port, int tls_port, bool* port_taken);
  Status MakeCertificate();
  std::string Config(int port, int tls_port) const;

  Options options_;
  pid_t pid_ = -1;
  int port_ = 0;
  int tls_port_ = 0;
  std::string dir_;  // config, base_dir, state_dir, log, passwd, home
  unsigned seeded_ = 0;
};

}  // namespace ghost

#endif  // GHOST_TESTS_COMMON_DOVECOT_FIXTURE_H_
