// The mail proxy's config keys. See proxy/mail_proxy_config.h.
#include "proxy/mail_proxy_config.h"

#include <algorithm>
#include <set>
#include <utility>

#include "common/config/config.h"
#include "common/config/toml_file.h"

namespace ghost {

bool IsMailProxyKey(std::string_view key) {
  static const std::set<std::string, std::less<>> kKeys = {
      "imap_listen", "imap_origin", "imap_max_line", "imap_max_literal", "imap_timeout",
      "smtp_listen", "smtp_origin", "smtp_outbox", "smtp_deadline", "smtp_outbox_cap",
      "imap_journal", "imap_deadline", "imap_tls_cert", "imap_tls_key", "imaps_listen",
      "imap_origin_starttls", "imap_origin_plain_login"};
  return kKeys.count(key) > 0;
}

Result<MailProxyOptions::OriginStartTls> ParseOriginStartTls(std::string_view text) {
  using S = MailProxyOptions::OriginStartTls;
  if (text == "if-offered") return S::kIfOffered;
  if (text == "required") return S::kRequired;
  if (text == "never") return S::kNever;
  return Status::InvalidArgument("STARTTLS toward the IMAP server must be \"if-offered\", \"required\" or "
                                 "\"never\", not \"" + std::string(text) + "\"");
}

Status LoadMailProxyConfig(const toml::table& t, const std::string& path, MailProxyOptions* o,
                           SmtpProxyOptions* smtp) {
  auto bad = [&](const toml::node& n, const std::string& what) {
    return Status::InvalidArgument(TomlWhere(path, n.source()) + ": " + what);
  };
  if (const toml::node* n = t.get("imap_listen")) {
    auto s = n->value<std::string>();
    if (!s) return bad(*n, "\"imap_listen\" must be a string such as \"127.0.0.1:1143\"");
    Result<ListenAddress> la = ListenAddress::Parse(*s);
    if (!la.ok()) return bad(*n, la.status().message());
    o->imap_listen = *la;
  }
  if (const toml::node* n = t.get("imap_origin")) {
    auto s = n->value<std::string>();
    if (!s) return bad(*n, "\"imap_origin\" must be a string such as \"imaps://mail.example:993/\"");
    o->imap_origin = *s;
  }
  if (const toml::node* n = t.get("imap_max_literal")) {
    Result<Bytes> b = TomlSize(*n, "imap_max_literal");
    if (!b.ok() || *b == 0) return bad(*n, "\"imap_max_literal\" must be a size above zero, e.g. \"256M\"");
    o->max_literal = *b;
  }
  if (const toml::node* n = t.get("imap_max_line")) {
    Result<Bytes> b = TomlSize(*n, "imap_max_line");
    if (!b.ok() || *b < 1024) return bad(*n, "\"imap_max_line\" must be a size of at least 1K");
    o->client_max_line = *b;
    o->server_max_line = std::max<std::size_t>(o->server_max_line, *b);
  }
  if (const toml::node* n = t.get("imap_timeout")) {
    auto d = n->value<double>();
    if (!d || *d <= 0 || !IsUserSeconds(*d))
      return bad(*n, "\"imap_timeout\" must be a positive number of seconds (at most 1e9)");
    o->timeout = Seconds(*d);
  }
  if (const toml::node* n = t.get("imap_journal")) {
    auto s = n->value<std::string>();
    if (!s || s->empty()) return bad(*n, "\"imap_journal\" must be a file path (the deferred changes' journal)");
    o->imap_journal = *s;
  }
  if (const toml::node* n = t.get("imap_deadline")) {
    auto d = n->value<double>();
    if (!d || *d <= 0 || !IsUserSeconds(*d))
      return bad(*n, "\"imap_deadline\" must be a positive number of seconds (at most 1e9)");
    o->imap_deadline = Seconds(*d);
  }
  for (auto [key, out] : {std::pair<const char*, std::string*>{"imap_tls_cert", &o->tls_cert},
                          {"imap_tls_key", &o->tls_key}}) {
    if (const toml::node* n = t.get(key)) {
      auto s = n->value<std::string>();
      if (!s || s->empty()) return bad(*n, std::string("\"") + key + "\" must be a file path (PEM)");
      *out = *s;
    }
  }
  if (const toml::node* n = t.get("imaps_listen")) {
    auto s = n->value<std::string>();
    if (!s) return bad(*n, "\"imaps_listen\" must be a string such as \"127.0.0.1:1993\"");
    Result<ListenAddress> la = ListenAddress::Parse(*s);
    if (!la.ok()) return bad(*n, "\"imaps_listen\": " + la.status().message());
    o->imaps_listen = *la;
  }
  if (const toml::node* n = t.get("imap_origin_starttls")) {
    auto s = n->value<std::string>();
    if (!s) return bad(*n, "\"imap_origin_starttls\" must be \"if-offered\", \"required\" or \"never\"");
    Result<MailProxyOptions::OriginStartTls> v = ParseOriginStartTls(*s);
    if (!v.ok()) return bad(*n, "\"imap_origin_starttls\": " + v.status().message());
    o->origin_starttls = *v;
  }
  if (const toml::node* n = t.get("imap_origin_plain_login")) {
    auto b = n->value<bool>();
    if (!b) return bad(*n, "\"imap_origin_plain_login\" must be true or false");
    o->origin_plain_login = *b;
  }
  if (const toml::node* n = t.get("smtp_listen")) {
    auto s = n->value<std::string>();
    if (!s) return bad(*n, "\"smtp_listen\" must be a string such as \"127.0.0.1:1587\"");
    Result<ListenAddress> la = ListenAddress::Parse(*s);
    if (!la.ok()) return bad(*n, la.status().message());
    smtp->smtp_listen = *la;
  }
  for (auto [key, out] : {std::pair<const char*, std::string*>{"smtp_origin", &smtp->smtp_origin},
                          {"smtp_outbox", &smtp->outbox}}) {
    if (const toml::node* n = t.get(key)) {
      auto s = n->value<std::string>();
      if (!s) return bad(*n, std::string("\"") + key + "\" must be a string");
      *out = *s;
    }
  }
  if (const toml::node* n = t.get("smtp_deadline")) {
    auto d = n->value<double>();
    if (!d || *d <= 0 || !IsUserSeconds(*d))
      return bad(*n, "\"smtp_deadline\" must be a positive number of seconds (at most 1e9)");
    smtp->deadline = Seconds(*d);
  }
  if (const toml::node* n = t.get("smtp_outbox_cap")) {
    Result<Bytes> b = TomlSize(*n, "smtp_outbox_cap");
    if (!b.ok() || *b == 0) return bad(*n, "\"smtp_outbox_cap\" must be a size above zero, e.g. \"1M\"");
    smtp->cap = *b;
  }
  return Status::Ok();
}

Status ValidateMailProxy(const MailProxyOptions& o, const SmtpProxyOptions& smtp) {
  if (smtp.smtp_listen && (smtp.smtp_origin.empty() || smtp.outbox.empty())) {
    return Status::InvalidArgument(
        "--smtp-listen needs --smtp-origin smtp[s]://HOST:PORT/ and --smtp-outbox DIR");
  }
  if (o.imap_listen && o.imap_origin.empty()) {
    return Status::InvalidArgument(
        "--imap-listen needs --imap-origin imap[s]://HOST:PORT/ (the IMAP server to relay to)");
  }
  if (!o.imap_listen && !o.imaps_listen && !o.imap_origin.empty()) {
    return Status::InvalidArgument("--imap-origin needs --imap-listen HOST:PORT (where mail clients connect)");
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Status::InvalidArgument(
        "--imap-tls-cert and --imap-tls-key go together (the certificate chain and its private key)");
  }
  if (!o.tls_cert.empty() && !o.imap_listen && !o.imaps_listen) {
    return Status::InvalidArgument("--imap-tls-cert needs --imap-listen or --imaps-listen HOST:PORT");
  }
  if (o.imaps_listen && o.tls_cert.empty()) {
    return Status::InvalidArgument(
        "--imaps-listen needs --imap-tls-cert FILE and --imap-tls-key FILE (the certificate it presents)");
  }
  if (o.imaps_listen && o.imap_origin.empty()) {
    return Status::InvalidArgument(
        "--imaps-listen needs --imap-origin imap[s]://HOST:PORT/ (the IMAP server to relay to)");
  }
  return Status::Ok();
}

}  // namespace ghost
