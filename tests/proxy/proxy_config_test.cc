#include "proxy/proxy_config.h"
#include "proxy/mail_proxy_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace ghost {
namespace {

class ProxyConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ghostproxy-config-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    ::close(fd);
    path_ = tmpl;
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  Status Load(const std::string& text, GhostproxyOptions* o) {
    std::ofstream(path_) << text;
    return LoadProxyConfigFile(path_, o);
  }

  std::string path_;
};

TEST_F(ProxyConfigTest, ReadsEveryKey) {
  GhostproxyOptions o;
  const Status s = Load(R"(
listen = "[::1]:8080"
mount = "/mnt/ghost"
control = "/run/g.sock"
allow = ["192.168.1.0/24", "fd00::/8"]
connect_ports = [443, 8443]
access_log = "/var/log/ghost.log"
access_log_queue = "64K"
via = "laptop"
max_connections = 7
max_connections_per_client = 3
preempt_after = 0.25
max_header_bytes = "16K"
max_headers = 50
request_timeout = 1.5
send_timeout = 2
connect_timeout = 3
origin_timeout = 4
fallback_timeout = 0.5
tunnel_idle_timeout = 5
origin_idle_timeout = 6
max_idle_per_origin = 2
heuristic_freshness = 60
high_watermark = "1M"
memory_cache = "16M"
)",
                        &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(o.proxy.listen.ToString(), "[::1]:8080");
  EXPECT_EQ(o.mountpoint, "/mnt/ghost");
  EXPECT_EQ(o.control_path, "/run/g.sock");
  ASSERT_EQ(o.proxy.allow.size(), 2u);
  EXPECT_EQ(o.proxy.allow[1].ToString(), "fd00::/8");
  EXPECT_EQ(o.proxy.connect_ports, (std::vector<std::uint16_t>{443, 8443}));
  EXPECT_EQ(o.proxy.access_log, "/var/log/ghost.log");
  EXPECT_EQ(o.proxy.access_log_queue, 64u << 10);
  EXPECT_EQ(o.proxy.via_name, "laptop");
  EXPECT_EQ(o.proxy.max_connections, 7u);
  EXPECT_EQ(o.proxy.max_connections_per_client, 3u);
  EXPECT_EQ(o.proxy.preempt_after, Millis(250));
  EXPECT_EQ(o.proxy.limits.max_header_bytes, 16u * 1024);
  EXPECT_EQ(o.proxy.limits.max_headers, 50u);
  EXPECT_EQ(o.proxy.request_timeout, Millis(1500));
  EXPECT_EQ(o.proxy.tunnel_idle_timeout, Seconds(5));
  EXPECT_EQ(o.proxy.origin_timeout, Seconds(4));
  EXPECT_EQ(o.proxy.fallback_timeout, Millis(500));
  EXPECT_EQ(o.proxy.max_idle_per_origin, 2u);
  EXPECT_EQ(o.proxy.heuristic_freshness, Seconds(60));
  EXPECT_EQ(o.proxy.high_watermark, 1u << 20);
  EXPECT_EQ(o.memory_cache, 16u << 20);
  EXPECT_TRUE(Validate(o).ok());
}

TEST_F(ProxyConfigTest, MemoryCacheDefaultsTo64MAndZeroDisablesIt) {
  GhostproxyOptions o;
  EXPECT_EQ(o.memory_cache, 64u << 20);
  const Status s = Load("memory_cache = 0\n", &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(o.memory_cache, 0u);
}

TEST_F(ProxyConfigTest, PerClientLimitZeroMeansOnlyTheGlobalLimit) {
  GhostproxyOptions o;
  EXPECT_EQ(o.proxy.max_connections_per_client, 256u);
  EXPECT_EQ(o.proxy.preempt_after, Seconds(1));
  const Status s = Load("max_connections_per_client = 0\n", &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(o.proxy.max_connections_per_client, 0u);
}

TEST_F(ProxyConfigTest, ReadsTheShapingKeysAndRejectsBadOnes) {
  GhostproxyOptions o;
  const Status s = Load(R"(
shape = "always"
shape_knob = 20
shape_max_slowdown = 1.5
shape_threshold = "1M"
shape_buffer = "32K"
plain_rcvbuf = "64K"
)", &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(o.proxy.shaping.mode, ShapeMode::kAlways);
  EXPECT_EQ(o.proxy.shaping.knob, 20);
  EXPECT_DOUBLE_EQ(o.proxy.shaping.max_slowdown, 1.5);
  EXPECT_EQ(o.proxy.shaping.threshold, 1u << 20);
  EXPECT_EQ(o.proxy.shaping.buffer, 32 * 1024);
  EXPECT_EQ(o.proxy.shaping.plain_buffer, 64 * 1024);
  EXPECT_EQ(GhostproxyOptions{}.proxy.shaping.plain_buffer, 0);  // autotuned unless asked
  for (const char* bad : {"shape = \"sometimes\"\n", "shape_knob = 101\n",
                          "shape_max_slowdown = 0.5\n", "shape_buffer = \"1K\"\n",
                          "plain_rcvbuf = \"1K\"\n"}) {
    GhostproxyOptions other;
    const Status e = Load(bad, &other);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_TRUE(e.message().find("shape") != std::string::npos ||
                e.message().find("plain_rcvbuf") != std::string::npos) << e.message();
  }
}

TEST_F(ProxyConfigTest, MailSizesAreBytesOrSuffixedStrings) {
  GhostproxyOptions o;
  const Status s = Load("imap_max_literal = \"2M\"\nimap_max_line = 4096\nsmtp_outbox_cap = \"3K\"\n", &o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(o.mail.max_literal, Bytes{2} << 20);
  EXPECT_EQ(o.mail.client_max_line, 4096u);
  EXPECT_GE(o.mail.server_max_line, 4096u);
  EXPECT_EQ(o.smtp.cap, 3u * 1024);
}

TEST_F(ProxyConfigTest, ReadsTheImapTlsKeysAndChecksTheirCombination) {
  GhostproxyOptions o;
  const Status s = Load("imap_tls_cert = \"/etc/g/c.pem\"\nimap_tls_key = \"/etc/g/k.pem\"\n"
                        "imaps_listen = \"127.0.0.1:1993\"\nimap_origin = \"imap://127.0.0.1:143/\"\n", &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(o.mail.tls_cert, "/etc/g/c.pem");
  EXPECT_EQ(o.mail.tls_key, "/etc/g/k.pem");
  ASSERT_TRUE(o.mail.imaps_listen);
  EXPECT_EQ(o.mail.imaps_listen->port, 1993);
  EXPECT_TRUE(ValidateMailProxy(o.mail, o.smtp).ok());  // IMAPS alone, without --imap-listen
  MailProxyOptions no_key = o.mail;
  no_key.tls_key.clear();
  EXPECT_NE(ValidateMailProxy(no_key, o.smtp).message().find("--imap-tls-key"), std::string::npos);
  MailProxyOptions no_cert = o.mail;
  no_cert.tls_cert.clear();
  no_cert.tls_key.clear();
  EXPECT_NE(ValidateMailProxy(no_cert, o.smtp).message().find("--imaps-listen needs"), std::string::npos);
  for (const char* bad : {"imap_tls_cert = \"\"\n", "imap_tls_key = 1\n", "imaps_listen = \"nowhere\"\n"}) {
    GhostproxyOptions other;
    const Status e = Load(bad, &other);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.message().find("imap"), std::string::npos) << e.message();
  }
}

TEST_F(ProxyConfigTest, ReadsTheOriginStartTlsKeysAndRejectsBadOnes) {
  GhostproxyOptions o;
  EXPECT_EQ(o.mail.origin_starttls, MailProxyOptions::OriginStartTls::kIfOffered);
  EXPECT_FALSE(o.mail.origin_plain_login);
  const Status s = Load("imap_origin_starttls = \"required\"\nimap_origin_plain_login = true\n", &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(o.mail.origin_starttls, MailProxyOptions::OriginStartTls::kRequired);
  EXPECT_TRUE(o.mail.origin_plain_login);
  EXPECT_EQ(*ParseOriginStartTls("never"), MailProxyOptions::OriginStartTls::kNever);
  EXPECT_EQ(*ParseOriginStartTls("if-offered"), MailProxyOptions::OriginStartTls::kIfOffered);
  for (const char* bad : {"imap_origin_starttls = \"maybe\"\n", "imap_origin_starttls = 1\n",
                          "imap_origin_plain_login = \"yes\"\n"}) {
    GhostproxyOptions other;
    const Status e = Load(bad, &other);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.message().find("imap_origin_"), std::string::npos) << e.message();
  }
}

TEST_F(ProxyConfigTest, ReadsTheDeferredImapChangesKeysAndRejectsBadOnes) {
  GhostproxyOptions o;
  const Status s = Load("imap_journal = \"/var/spool/g/imap-journal\"\nimap_deadline = 30\n", &o);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(o.mail.imap_journal, "/var/spool/g/imap-journal");
  EXPECT_EQ(o.mail.imap_deadline, std::chrono::seconds(30));
  for (const char* bad : {"imap_journal = \"\"\n", "imap_journal = 3\n", "imap_deadline = 0\n",
                          "imap_deadline = \"soon\"\n"}) {
    GhostproxyOptions other;
    const Status e = Load(bad, &other);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.message().find("imap_"), std::string::npos) << e.message();
  }
}

TEST_F(ProxyConfigTest, ErrorsNameTheFileLineAndProblem) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c :
       {Case{"listen = \"nowhere\"", "listen address"},
        Case{"\n\nallow = [\"10.1.0.0/8\"]", ":3: --allow"},
        Case{"allow = \"10.0.0.0/8\"", "must be an array"}, Case{"connect_ports = [0]", "1..65535"},
        Case{"max_connections = -1", "positive integer"},
        Case{"max_connections_per_client = -2", "0 or more"},
        Case{"preempt_after = 0", "positive number of seconds"},
        Case{"preempt_after = 1e300", "at most 1e9"},
        Case{"imap_max_literal = 0", "\"imap_max_literal\" must be a size above zero"},
        Case{"imap_max_line = \"512\"", "\"imap_max_line\" must be a size of at least 1K"},
        Case{"smtp_outbox_cap = -1", "\"smtp_outbox_cap\" must be a size above zero"},
        Case{"imap_timeout = 1e300", "at most 1e9"},
        Case{"request_timeout = \"soon\"", "seconds"}, Case{"high_watermark = \"lots\"", "size"},
        Case{"memory_cache = \"lots\"", "size"}, Case{"memory_cache = -1", "\"memory_cache\""},
        Case{"high_watermark = 0", "\"high_watermark\" must be above zero"},
        Case{"access_log_queue = \"1K\"", "\"access_log_queue\" must be a size of at least 4K"},
        Case{"high_watermark = \"2X\"", "unknown suffix \"X\""},
        Case{"max_header_bytes = [1]", "\"max_header_bytes\" must be a size"},
        Case{"colour = \"blue\"", "unknown key \"colour\""}, Case{"listen = ", ""}}) {
    GhostproxyOptions o;
    const Status s = Load(c.text, &o);
    EXPECT_FALSE(s.ok()) << c.text;
    EXPECT_NE(s.message().find(path_), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.text << " → " << s.message();
  }
}

TEST_F(ProxyConfigTest, MissingFileAndMissingMountAreClear) {
  GhostproxyOptions o;
  const Status missing = LoadProxyConfigFile("/nonexistent/ghostproxy.toml", &o);
  EXPECT_EQ(missing.code(), Status::Code::kNotFound);
  const Status no_mount = Validate(o);
  EXPECT_FALSE(no_mount.ok());
  EXPECT_NE(no_mount.message().find("--mount"), std::string::npos);
}

}  // namespace
}  // namespace ghost
