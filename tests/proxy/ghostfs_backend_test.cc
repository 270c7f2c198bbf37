// The stored-head format GhostfsBackend keeps in the daemon's index (proxy/ghostfs_backend.h).
// The backend's traffic with a real daemon is tested end to end by the proxy's integration
// test (tests/integration/ghostproxy_test.py).
#include "proxy/ghostfs_backend.h"

#include <event2/event.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ghost {
namespace {

TEST(StoredResponseTest, RoundTripsEveryField) {
  StoredResponse r;
  r.status = 203;
  r.headers = {{"Content-Type", "text/html; charset=utf-8"}, {"Vary", "Accept-Encoding"},
               {"X-Odd", "quote \" backslash \\ tab\t, unicode \xc3\xa9"}, {"Set-Cookie", "a=1"},
               {"Set-Cookie", "b=2"}};
  r.stored_unix = 1795380000;
  r.expires_unix = 1795383600;
  Result<StoredResponse> back = ParseStoredResponse(SerializeStoredResponse(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->status, 203);
  EXPECT_EQ(back->headers, r.headers);  // order and repeats kept
  EXPECT_EQ(back->stored_unix, r.stored_unix);
  EXPECT_EQ(back->expires_unix, r.expires_unix);

  r.expires_unix.reset();
  back = ParseStoredResponse(SerializeStoredResponse(r));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->expires_unix.has_value());
}

// The head every miss stores is written without a json tree; it must be exactly what the json
// library writes (the daemon keeps the text, and older heads were written that way), for any
// header bytes: every control character, quotes, backslashes, DEL, and non-ASCII (which takes
// the library's path).
TEST(StoredResponseTest, IsWhatTheJsonLibraryWrites) {
  auto reference = [](const StoredResponse& r) {
    nlohmann::json headers = nlohmann::json::array();
    for (const auto& [name, value] : r.headers) headers.push_back({name, value});
    return nlohmann::json{{"status", r.status},
                          {"headers", headers},
                          {"stored_unix", r.stored_unix},
                          {"expires_unix", r.expires_unix ? nlohmann::json(*r.expires_unix) : nlohmann::json()}}
        .dump();
  };
  std::string every_ascii;
  for (int c = 0; c < 0x80; ++c) every_ascii += static_cast<char>(c);
  std::vector<StoredResponse> heads(5);
  heads[0].headers = {{"ETag", "\"abc\""}, {"Content-Type", "text/plain"}, {"X-Path", "C:\\dir\\f"}};
  heads[0].stored_unix = 1795380000;
  heads[0].expires_unix = 1795383600;
  heads[1].status = 404;
  heads[1].headers = {{"X-All", every_ascii}, {every_ascii, ""}};
  heads[1].stored_unix = -5;
  heads[1].expires_unix = -1;
  heads[2].status = 999;  // no headers, no expiry
  heads[3].headers = {{"X-Latin", "caf\xc3\xa9"}, {"ETag", "\"x\""}};
  heads[3].expires_unix = 0;
  heads[4].headers = {{"Last-Modified", "Thu, 26 Nov 2026 12:00:00 GMT"}, {"Vary", ""}};
  for (const StoredResponse& r : heads) {
    EXPECT_EQ(SerializeStoredResponse(r), reference(r));
    Result<StoredResponse> back = ParseStoredResponse(SerializeStoredResponse(r));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->headers, r.headers);
  }
}

TEST(StoredResponseTest, RefusesWhatIsNotAStoredHead) {
  for (const char* bad : {"", "not json", "[]", "{}", R"({"status":"200","headers":[]})",
                          R"({"status":42,"headers":[]})", R"({"status":200})",
                          R"({"status":200,"headers":{"a":"b"}})", R"({"status":200,"headers":[["a"]]})",
                          R"({"status":200,"headers":[["a",1]]})", "{\"status\":200,\"headers\":[[\"a\",\"b\"]"}) {
    Result<StoredResponse> r = ParseStoredResponse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("stored head"), std::string::npos) << r.status().ToString();
    }
  }
}

TEST(MakeGhostfsBackendTest, ExplainsAMountThatIsNotGhostfs) {
  event_base* base = event_base_new();
  Result<std::unique_ptr<CacheBackend>> b = MakeGhostfsBackend(base, "/tmp", "/nonexistent/control.sock");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("not a ghostfs mount"), std::string::npos) << b.status().ToString();
  event_base_free(base);
}

}  // namespace
}  // namespace ghost
