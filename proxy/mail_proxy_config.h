// The mail proxy's keys in ghostproxy's config file (proxy/proxy_config.h reads the file and
// hands these keys here; the fields are MailProxyOptions in proxy/imap_proxy.h):
//
//   imap_listen = "127.0.0.1:1143"        # where mail clients connect (no IMAP proxy without it)
//   imap_origin = "imaps://mail.example:993/"   # the IMAP server (imap:// plain, loopback)
//   imap_max_line = "64K"                 # bytes of one client line (BAD and close past it)
//   imap_max_literal = "256M"             # bytes one literal may announce (BAD and close past it)
//   imap_timeout = 60                     # seconds of silence mid-frame or awaiting an answer
//   imap_journal = "/var/spool/ghostproxy/imap-journal"  # deferred changes (imap_deferred.h)
//   imap_deadline = 60                    # seconds a deferred change waits at knob 50
//   imap_tls_cert = "/etc/ghost/imap.pem"  # certificate chain (PEM) for TLS toward clients
//   imap_tls_key = "/etc/ghost/imap.key"   # its private key (PEM); both or neither
//   imaps_listen = "127.0.0.1:1993"       # implicit TLS (IMAPS) listener; needs the certificate
//   imap_origin_starttls = "if-offered"   # STARTTLS toward an imap:// origin: or "required", "never"
//   imap_origin_plain_login = false       # allow logins in clear to a non-loopback imap:// origin
//   smtp_listen = "127.0.0.1:1587"        # SMTP submission (proxy/smtp_proxy.h)
//   smtp_origin = "smtps://mail.example:465/"   # or smtp://HOST:587/ (STARTTLS when offered)
//   smtp_outbox = "/var/spool/ghostproxy/outbox"  # the durable outbox (common/imap/outbox.h)
//   smtp_deadline = 60                    # seconds mail may wait for the radio
//   smtp_outbox_cap = "1M"                # waiting bytes past which the outbox is sent
//
// Thread-safety: reentrant.
#ifndef GHOST_PROXY_MAIL_PROXY_CONFIG_H_
#define GHOST_PROXY_MAIL_PROXY_CONFIG_H_

#include <toml++/toml.h>

#include <string>
#include <string_view>

#include "common/base/status.h"
#include "proxy/imap_proxy.h"
#include "proxy/smtp_proxy.h"

namespace ghost {

bool IsMailProxyKey(std::string_view key);
// "if-offered", "required" or "never" (imap_origin_starttls, --imap-origin-starttls); fails
// naming the three otherwise.
[[nodiscard]] Result<MailProxyOptions::OriginStartTls> ParseOriginStartTls(std::string_view text);
// Reads the keys above from `t` (the file `path`); errors name the file, the line and the key.
[[nodiscard]] Status LoadMailProxyConfig(const toml::table& t, const std::string& path,
                                         MailProxyOptions* o, SmtpProxyOptions* smtp);
// Checks the combination: an IMAP listener needs an origin; an SMTP one an origin and an outbox;
// a TLS certificate needs its key (and the other way round) and an IMAP listener; an IMAPS
// listener needs the certificate.
[[nodiscard]] Status ValidateMailProxy(const MailProxyOptions& o, const SmtpProxyOptions& smtp);

}  // namespace ghost

#endif  // GHOST_PROXY_MAIL_PROXY_CONFIG_H_
