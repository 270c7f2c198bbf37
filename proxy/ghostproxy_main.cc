// ghostproxy: an HTTP/1.1 forward proxy that serves browsers from the cache of a running ghostfs.
// See `ghostproxy --help`, proxy/proxy.h and proxy/proxy_config.h.
//
// Exit codes: 0 after SIGINT/SIGTERM, 1 runtime failure (ghostfs not reachable, address in use),
// 2 bad options or config.
#include <event2/event.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/base/log.h"
#include "common/build_info.h"
#include "common/base/clock.h"
#include "common/config/config.h"
#include "common/control/control.h"
#include "proxy/dashboard.h"
#include "proxy/ghostfs_backend.h"
#include "proxy/imap_proxy.h"
#include "proxy/smtp_proxy.h"
#include "proxy/proxy.h"
#include "proxy/mail_proxy_config.h"
#include "proxy/proxy_config.h"
#include "proxy/socket_activation.h"

namespace {

struct EventBaseDeleter {
  void operator()(event_base* b) const { ghost::FreeEventBase(b); }
};
struct EventDeleter {
  void operator()(event* e) const { event_free(e); }
};

void OnSignal(evutil_socket_t, short, void* arg) {
  event_base_loopexit(static_cast<event_base*>(arg), nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen, mount, control, config, access_log, connect_ports, via, memory_cache,
      access_log_queue;
  std::vector<std::string> allow;
  std::string imap_listen, imap_origin, smtp_listen, smtp_origin, smtp_outbox;
  std::string imap_journal;
  std::string imap_tls_cert, imap_tls_key, imaps_listen;
  std::string imap_origin_starttls;
  bool imap_origin_plain_login = false;
  std::size_t max_connections = 0;
  std::size_t max_per_client = 0;
  double preempt_after = 0, request_timeout = 0;
  std::string shape;
  double shape_max_slowdown = 0;
  int shape_knob = -1;
  std::string plain_rcvbuf;
  CLI::App app{
      "ghostproxy: an HTTP/1.1 forward proxy for browsers and other HTTP clients that shares the\n"
      "cache of a running ghostfs (common/DESIGN.md §3.4, §4).\n\n"
      "For each cached object the ghostfs cost model chooses the disk or the network, as for a\n"
      "read through the mount; transfers are disclosed to its power manager. Every response says\n"
      "where it came from in X-Ghost-Source (cache, network, revalidated, stale, tunnel, proxy).\n"
      "Status: GET http://LISTEN/ghost/status (JSON) and /ghost/metrics (Prometheus)."};
  app.set_version_flag("--version", std::string("ghostproxy ") + GHOST_VERSION,
                       "print the version and exit");
  app.add_option("--listen", listen,
                 "HOST:PORT to listen on (default 127.0.0.1:3128; [::1]:PORT for IPv6). Only this "
                 "machine may connect unless --allow says otherwise. Ignored when started by "
                 "socket activation (LISTEN_FDS=1: the socket on fd 3)");
  app.add_option("--mount", mount, "the ghostfs mount point whose cache the proxy uses (required)");
  app.add_option(
      "--control", control,
      "that ghostfs's control socket, only needed if ghostfs was started with --control "
      "(default: the one ghostfs listens on for --mount, found from the mount point)");
  app.add_option(
      "--config", config,
      "TOML file with these settings and more (see proxy/proxy_config.h); the command line wins");
  app.add_option("--allow", allow,
                 "CIDR of other clients allowed to use the proxy, e.g. 192.168.1.0/24 (repeatable; "
                 "127.0.0.1 and ::1 are always allowed)");
  app.add_option(
      "--access-log", access_log,
      "append one line per request to FILE (squid's native format, result codes HIT, MISS, "
      "NET_PREFERRED, REVALIDATED, STALE, TUNNEL), written by a thread of its own; SIGHUP "
      "opens FILE again (logrotate)");
  app.add_option("--access-log-queue", access_log_queue,
                 "bytes of access-log lines that may wait for a slow or blocked log file (e.g. "
                 "4M, the default); lines past it are dropped and counted (/ghost/status)");
  std::string log_file, log_level, dashboard;
  bool verbose = false;
  app.add_option("--dashboard", dashboard,
                 "ADDR:PORT where to serve the dashboard (/ghost/: device modes, energy, the "
                 "saving against a static cache, queues; live by server-sent events), e.g. "
                 "127.0.0.1:3129; off unless given");
  app.add_option("--log-file", log_file, "append the log here (default: stderr)");
  app.add_option("--log-level", log_level, "error, warn, info (default) or debug");
  app.add_flag("-v,--verbose", verbose, "log at debug level (as --log-level debug)");
  app.add_option("--connect-ports", connect_ports,
                 "comma-separated ports CONNECT may tunnel to (default 443)");
  app.add_option("--max-connections", max_connections,
                 "client connections at once (default 512). At the limit a new connection takes "
                 "the place of one that has waited --preempt-after seconds for its request head; "
                 "else it gets 503");
  CLI::Option* per_client_opt = app.add_option(
      "--max-connections-per-client", max_per_client,
      "connections one client address may hold; more get 429 (default 256; 0: only "
      "--max-connections)");
  app.add_option("--preempt-after", preempt_after,
                 "seconds a connection may wait for a request head before, at the connection "
                 "limit, a new connection takes its place (default 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--request-timeout", request_timeout,
                 "seconds within which a whole request head must arrive after connecting or "
                 "after the previous response, else 408 (default 30)")
      ->check(CLI::PositiveNumber);
  app.add_option("--memory-cache", memory_cache,
                 "bytes of recently served responses kept in the proxy's RAM and served without "
                 "asking ghostfs (e.g. 64M, the default; 0 keeps none)");
  app.add_option(
      "--via", via,
      "the name this proxy gives itself in Via, used to detect loops (default HOSTNAME:PORT)");
  app.add_option("--imap-listen", imap_listen,
                 "HOST:PORT where mail clients connect to the IMAP proxy (e.g. 127.0.0.1:1143); "
                 "message bodies come from the cache when the cost model picks the disk");
  app.add_option("--imap-origin", imap_origin,
                 "the IMAP server the IMAP proxy relays to: imaps://HOST:993/ or imap://HOST:PORT/ "
                 "(no user: each client logs in with its own)");
  app.add_option("--imap-journal", imap_journal,
                 "the journal of the IMAP proxy's deferred changes: flag changes are answered at "
                 "once and sent when the radio is up (without it they go to the server at once)");
  app.add_option("--imap-tls-cert", imap_tls_cert,
                 "PEM certificate chain for TLS toward mail clients: the IMAP listener offers "
                 "STARTTLS (and refuses logins before it unless on loopback)");
  app.add_option("--imap-tls-key", imap_tls_key, "the private key (PEM) of --imap-tls-cert");
  app.add_option("--imaps-listen", imaps_listen,
                 "HOST:PORT where mail clients connect with implicit TLS (IMAPS, e.g. "
                 "127.0.0.1:1993); needs --imap-tls-cert and --imap-tls-key");
  app.add_option("--imap-origin-starttls", imap_origin_starttls,
                 "STARTTLS toward an imap:// origin: if-offered (default), required, never");
  app.add_flag("--imap-origin-plain-login", imap_origin_plain_login,
               "let logins go in clear to an imap:// origin off this machine that has no STARTTLS");
  app.add_option("--smtp-listen", smtp_listen,
                 "HOST:PORT where mail clients submit mail (e.g. 127.0.0.1:1587): journaled, "
                 "answered at once, sent when the radio is up (SIGUSR1 sends now)");
  app.add_option("--smtp-origin", smtp_origin,
                 "the submission server: smtps://HOST:465/ or smtp://HOST:587/ (STARTTLS when "
                 "offered)");
  app.add_option("--smtp-outbox", smtp_outbox, "the directory of the durable outbox");
  app.add_option("--shape", shape,
                 "download shaping of large responses and CONNECT downloads, so the network card "
                 "can sleep between bursts (DESIGN §3.6): auto (when the eq. 4 cost at the knob "
                 "says it pays; the default), always, or off")
      ->check(CLI::IsMember({"auto", "always", "off"}));
  app.add_option("--shape-max-slowdown", shape_max_slowdown,
                 "never shape a download slower than this factor of plain TCP (default from the "
                 "knob: 3 at K=0, 2 at K=50, 1 at K=100)")
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--shape-knob", shape_knob,
                 "the knob K (0 saves energy, 100 favours performance) the shaping decision uses "
                 "(default 50; K=100 never shapes)")
      ->check(CLI::Range(0, 100));
  app.add_option("--plain-rcvbuf", plain_rcvbuf,
                 "a measurement aid, not a saving: fix SO_RCVBUF of every origin socket to BYTES "
                 "before connect (e.g. 64K), so plain TCP runs with a fixed window as the shaping "
                 "paper's clients did (use with --shape off for that baseline)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ghostproxy: %s (see --help)\n", e.what());
    return 2;
  }
  auto fail = [](const std::string& msg, int code) {
    std::fprintf(stderr, "ghostproxy: %s\n", msg.c_str());
    return code;
  };

  // The file first, then the command line over it.
  ghost::GhostproxyOptions o;
  if (!config.empty()) {
    if (ghost::Status s = ghost::LoadProxyConfigFile(config, &o); !s.ok())
      return fail(s.message(), 2);
  }
  if (!listen.empty()) {
    ghost::Result<ghost::ListenAddress> la = ghost::ListenAddress::Parse(listen);
    if (!la.ok()) return fail("--listen: " + la.status().message(), 2);
    o.proxy.listen = *la;
  }
  if (!mount.empty()) o.mountpoint = mount;
  if (!control.empty()) o.control_path = control;
  if (!access_log.empty()) o.proxy.access_log = access_log;
  if (!via.empty()) o.proxy.via_name = via;
  if (max_connections > 0) o.proxy.max_connections = max_connections;
  if (per_client_opt->count() > 0) o.proxy.max_connections_per_client = max_per_client;
  if (preempt_after > 0) o.proxy.preempt_after = ghost::Seconds(preempt_after);
  if (request_timeout > 0) o.proxy.request_timeout = ghost::Seconds(request_timeout);
  if (!shape.empty()) o.proxy.shaping.mode = *ghost::ParseShapeMode(shape.c_str());
  if (shape_max_slowdown > 0) o.proxy.shaping.max_slowdown = shape_max_slowdown;
  if (shape_knob >= 0) {
    o.proxy.shaping.knob = shape_knob;
    o.proxy.shaping.knob_fixed = true;  // an override: ghostfs's knob no longer applies
  }
  if (!plain_rcvbuf.empty()) {
    ghost::Result<ghost::Bytes> b = ghost::ParseSize(plain_rcvbuf);
    if (!b.ok()) return fail("--plain-rcvbuf: " + b.status().message(), 2);
    if (*b < 4096 || *b > (64u << 20)) return fail("--plain-rcvbuf: must be between 4K and 64M", 2);
    o.proxy.shaping.plain_buffer = static_cast<int>(*b);
  }
  if (!access_log_queue.empty()) {
    ghost::Result<ghost::Bytes> b = ghost::ParseSize(access_log_queue);
    if (!b.ok()) return fail("--access-log-queue: " + b.status().message(), 2);
    if (*b < 4096) return fail("--access-log-queue: must be at least 4K", 2);
    o.proxy.access_log_queue = *b;
  }
  if (!memory_cache.empty()) {
    ghost::Result<ghost::Bytes> b = ghost::ParseSize(memory_cache);
    if (!b.ok()) return fail("--memory-cache: " + b.status().message(), 2);
    o.memory_cache = *b;
  }
  if (!allow.empty()) {
    o.proxy.allow.clear();
    for (const std::string& a : allow) {
      ghost::Result<ghost::Cidr> c = ghost::Cidr::Parse(a);
      if (!c.ok()) return fail(c.status().message(), 2);
      o.proxy.allow.push_back(*c);
    }
  }
  if (!connect_ports.empty()) {
    ghost::Result<std::vector<std::uint16_t>> ports = ghost::ParsePortList(connect_ports);
    if (!ports.ok()) return fail("--connect-ports: " + ports.status().message(), 2);
    o.proxy.connect_ports = *ports;
  }
  if (!imap_listen.empty()) {
    ghost::Result<ghost::ListenAddress> la = ghost::ListenAddress::Parse(imap_listen);
    if (!la.ok()) return fail("--imap-listen: " + la.status().message(), 2);
    o.mail.imap_listen = *la;
  }
  if (!imap_origin.empty()) o.mail.imap_origin = imap_origin;
  if (!imap_journal.empty()) o.mail.imap_journal = imap_journal;
  if (!imap_tls_cert.empty()) o.mail.tls_cert = imap_tls_cert;
  if (!imap_tls_key.empty()) o.mail.tls_key = imap_tls_key;
  if (!imaps_listen.empty()) {
    ghost::Result<ghost::ListenAddress> la = ghost::ListenAddress::Parse(imaps_listen);
    if (!la.ok()) return fail("--imaps-listen: " + la.status().message(), 2);
    o.mail.imaps_listen = *la;
  }
  if (!imap_origin_starttls.empty()) {
    ghost::Result<ghost::MailProxyOptions::OriginStartTls> v = ghost::ParseOriginStartTls(imap_origin_starttls);
    if (!v.ok()) return fail("--imap-origin-starttls: " + v.status().message(), 2);
    o.mail.origin_starttls = *v;
  }
  if (imap_origin_plain_login) o.mail.origin_plain_login = true;
  if (!smtp_listen.empty()) {
    ghost::Result<ghost::ListenAddress> la = ghost::ListenAddress::Parse(smtp_listen);
    if (!la.ok()) return fail("--smtp-listen: " + la.status().message(), 2);
    o.smtp.smtp_listen = *la;
  }
  if (!smtp_origin.empty()) o.smtp.smtp_origin = smtp_origin;
  if (!smtp_outbox.empty()) o.smtp.outbox = smtp_outbox;
  if (!log_file.empty()) o.log_file = log_file;
  if (!log_level.empty()) o.log_level = log_level;
  ghost::Result<ghost::LogOptions> log =
      ghost::ChooseLogOptions("ghostproxy", o.log_file, o.log_level, verbose, /*daemon=*/false);
  if (!log.ok()) return fail("--log-level: " + log.status().message(), 2);
  if (ghost::Status s = ghost::ConfigureLog(*log); !s.ok()) return fail(s.message(), 2);
  if (ghost::Status s = ghost::Validate(o); !s.ok()) return fail(s.message(), 2);
  // --control (or the config's control) if given, else the socket of the ghostfs at --mount.
  ghost::Result<std::string> control_path = ghost::FindControlPath(o.control_path, o.mountpoint);
  if (!control_path.ok()) return fail(control_path.status().message(), 2);
  o.control_path = *control_path;
  // Started by a .socket unit: accept on its socket instead of binding --listen.
  ghost::Result<int> inherited = ghost::TakeInheritedListenSocket();
  if (!inherited.ok()) return fail(inherited.status().message(), 2);
  o.proxy.listen_fd = *inherited;

  // Every connection, refused ones included while their answer goes out, is a descriptor, and
  // so is each origin connection: the usual soft limit of 1024 is below what the defaults need.
  if (rlimit nofile{}; getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);  // best effort: the limit stays as it was on failure
  }
  std::unique_ptr<event_base, EventBaseDeleter> base(ghost::MakeEventBase());
  if (!base) return fail("cannot create the event loop", 1);
  ghost::RealClock clock(base.get());
  ghost::GhostfsBackendOptions backend_options;
  backend_options.memory_cache = o.memory_cache;
  ghost::Result<std::unique_ptr<ghost::CacheBackend>> backend =
      ghost::MakeGhostfsBackend(base.get(), o.mountpoint, o.control_path, backend_options);
  if (!backend.ok()) return fail(backend.status().message(), 1);
  std::unique_ptr<ghost::Dashboard> board;  // --dashboard: started below, once the proxy runs
  o.proxy.extra_metrics = [&board] { return board ? board->MetricsText() : std::string(); };
  o.proxy.dashboard_url = [&board] { return board ? "http://" + board->address() + "/ghost/" : std::string(); };
  ghost::Result<std::unique_ptr<ghost::Proxy>> proxy =
      ghost::Proxy::Start(base.get(), &clock, backend->get(), o.proxy);
  if (!proxy.ok()) {
    const bool usage = proxy.status().code() == ghost::Status::Code::kInvalidArgument;
    return fail(proxy.status().message(), usage ? 2 : 1);
  }
  // The IMAP proxy for mail clients (proxy/imap_proxy.h), over the same cache.
  std::unique_ptr<ghost::ImapProxy> imap;
  if (o.mail.imap_listen || o.mail.imaps_listen) {
    o.mail.control_path = o.control_path;
    ghost::Result<std::unique_ptr<ghost::ImapProxy>> started =
        ghost::ImapProxy::Start(base.get(), backend->get(), o.mail);
    if (!started.ok()) {
      const bool usage = started.status().code() == ghost::Status::Code::kInvalidArgument;
      return fail(started.status().message(), usage ? 2 : 1);
    }
    imap = std::move(*started);
    std::fprintf(stderr, "ghostproxy: IMAP on %s for %s\n", imap->address().ToString().c_str(),
                 o.mail.imap_origin.c_str());
    if (imap->tls_address()) {
      std::fprintf(stderr, "ghostproxy: IMAPS (implicit TLS) on %s\n", imap->tls_address()->ToString().c_str());
    }
  }
  // The SMTP outbox (proxy/smtp_proxy.h); SIGUSR1 sends it now.
  std::unique_ptr<ghost::SmtpProxy> smtp;
  std::unique_ptr<event, EventDeleter> sigusr1;
  if (o.smtp.smtp_listen) {
    o.smtp.control_path = o.control_path;
    ghost::Result<std::unique_ptr<ghost::SmtpProxy>> started =
        ghost::SmtpProxy::Start(base.get(), backend->get(), o.smtp);
    if (!started.ok()) {
      const bool usage = started.status().code() == ghost::Status::Code::kInvalidArgument;
      return fail(started.status().message(), usage ? 2 : 1);
    }
    smtp = std::move(*started);
    std::fprintf(stderr, "ghostproxy: SMTP on %s for %s (outbox %s)\n",
                 smtp->address().ToString().c_str(), o.smtp.smtp_origin.c_str(), o.smtp.outbox.c_str());
  }
  // SIGUSR1 sends the mail queues now: the IMAP proxy's deferred changes and the outbox.
  struct MailQueues {
    ghost::ImapProxy* imap;
    ghost::SmtpProxy* smtp;
  } queues{imap.get(), smtp.get()};
  if (imap || smtp) {
    sigusr1.reset(evsignal_new(
        base.get(), SIGUSR1,
        [](evutil_socket_t, short, void* p) {
          auto* q = static_cast<MailQueues*>(p);
          if (q->imap) q->imap->Flush("SIGUSR1");
          if (q->smtp) q->smtp->Flush("SIGUSR1");
        },
        &queues));
    evsignal_add(sigusr1.get(), nullptr);
  }
  if (!dashboard.empty()) {
    ghost::Result<ghost::ListenAddress> da = ghost::ListenAddress::Parse(dashboard);
    if (!da.ok()) return fail("--dashboard: " + da.status().message(), 2);
    ghost::Result<std::unique_ptr<ghost::Dashboard>> d =
        ghost::Dashboard::Start(base.get(), o.control_path, *da);
    if (!d.ok()) return fail(d.status().message(), 1);
    board = std::move(d).value();
    ghost::Log(ghost::LogLevel::kInfo, "dashboard at http://%s/ghost/", board->address().c_str());
  }
  // Signals are events on the loop: no handler runs outside it.
  std::unique_ptr<event, EventDeleter> sigint(
      evsignal_new(base.get(), SIGINT, &OnSignal, base.get()));
  std::unique_ptr<event, EventDeleter> sigterm(
      evsignal_new(base.get(), SIGTERM, &OnSignal, base.get()));
  evsignal_add(sigint.get(), nullptr);
  evsignal_add(sigterm.get(), nullptr);
  // SIGHUP: the access log's path is opened again (after logrotate renamed the file).
  std::unique_ptr<event, EventDeleter> sighup(evsignal_new(
      base.get(), SIGHUP,
      [](evutil_socket_t, short, void* p) {
        static_cast<ghost::Proxy*>(p)->ReopenAccessLog();
        ghost::Log(ghost::LogLevel::kInfo, "SIGHUP: reopening the access log");
      },
      proxy->get()));
  evsignal_add(sighup.get(), nullptr);
  if (ghost::Status s = ghost::CaptureStderr(base.get()); !s.ok()) {
    ghost::Log(ghost::LogLevel::kWarn, "stderr not captured: %s", s.ToString().c_str());
  }
  ghost::Log(ghost::LogLevel::kInfo, "listening on %s (cache of ghostfs at %s, control %s)",
             (*proxy)->address().ToString().c_str(), o.mountpoint.c_str(),
             o.control_path.c_str());
  event_base_dispatch(base.get());
  ghost::Log(ghost::LogLevel::kInfo, "stopping");
  board.reset();
  sigusr1.reset();
  smtp.reset();
  imap.reset();
  proxy->reset();  // before the backend it borrows
  backend->reset();
  return 0;
}
