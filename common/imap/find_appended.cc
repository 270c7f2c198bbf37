#include "common/imap/find_appended.h"

#include <strings.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace ghost {

std::string MessageIdOf(std::string_view msg) {
  std::size_t end = msg.find("\r\n\r\n");
  if (end == std::string_view::npos) end = msg.find("\n\n");
  std::string_view head = msg.substr(0, end);
  std::size_t pos = 0;
  while (pos < head.size()) {
    std::size_t eol = head.find('\n', pos);
    if (eol == std::string_view::npos) eol = head.size();
    std::string_view line = head.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.size() < 11 || strncasecmp(line.data(), "Message-ID:", 11) != 0) continue;
    std::string value(line.substr(11));
    // Folded onto the next lines (RFC 5322 §2.2.3).
    while (pos < head.size() && (head[pos] == ' ' || head[pos] == '\t')) {
      eol = head.find('\n', pos);
      if (eol == std::string_view::npos) eol = head.size();
      value += head.substr(pos, eol - pos);
      pos = eol + 1;
    }
    std::erase_if(value, [](char c) { return c == '\r' || c == '\n' || c == ' ' || c == '\t'; });
    return value;
  }
  return "";
}

namespace {

bool EqualIgnoringCr(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  for (;;) {
    while (i < a.size() && a[i] == '\r') ++i;
    while (j < b.size() && b[j] == '\r') ++j;
    if (i == a.size() || j == b.size()) return i == a.size() && j == b.size();
    if (a[i++] != b[j++]) return false;
  }
}

struct Search {
  ImapClient& client;
  std::shared_ptr<const std::string> body;
  std::int64_t internaldate;
  InMailbox in_mailbox;
  std::function<void(Result<std::uint32_t>)> done;
  std::vector<std::uint32_t> candidates;  // newest first
};

// Fetches candidate `i` and compares it with the body; on to the next when it differs.
void Compare(std::shared_ptr<Search> s, std::size_t i) {
  if (i == s->candidates.size()) return s->done(0u);
  s->in_mailbox([s, i](Status st) {
    if (!st.ok()) return s->done(st);
    auto got = std::make_shared<std::string>();
    // A candidate far longer than the body is not it; its bytes are not kept.
    const std::size_t cap = 2 * s->body->size() + 1024;
    s->client.FetchBody(
        s->candidates[i],
        [got, cap](std::string_view data) {
          if (got->size() <= cap) got->append(data);
          return true;
        },
        [s, i, got](Status fetched) {
          // Gone meanwhile (expunged by another client): not this one.
          if (!fetched.ok() && fetched.code() != Status::Code::kNotFound) return s->done(fetched);
          if (fetched.ok() && EqualIgnoringCr(*got, *s->body)) return s->done(s->candidates[i]);
          Compare(s, i + 1);
        });
  });
}

// Summarises `set` and keeps the UIDs with the APPEND's INTERNALDATE as candidates.
void Summarise(std::shared_ptr<Search> s, std::string set) {
  s->in_mailbox([s, set](Status st) {
    if (!st.ok()) return s->done(st);
    s->client.FetchSummary(set, [s](Result<std::vector<MessageSummary>> r) {
      if (!r.ok()) return s->done(r.status());
      for (const MessageSummary& m : *r) {
        if (!s->internaldate || m.internaldate_unix == s->internaldate) s->candidates.push_back(m.uid);
      }
      std::sort(s->candidates.rbegin(), s->candidates.rend());
      if (s->candidates.size() > static_cast<std::size_t>(kMaxCompared)) s->candidates.resize(kMaxCompared);
      Compare(s, 0);
    });
  });
}

}  // namespace

void FindAppended(ImapClient& client, std::shared_ptr<const std::string> body, std::int64_t internaldate,
                  InMailbox in_mailbox, std::function<void(Result<std::uint32_t>)> done) {
  auto s = std::make_shared<Search>(Search{client, std::move(body), internaldate, std::move(in_mailbox),
                                           std::move(done), {}});
  std::string id = MessageIdOf(*s->body);
  // Without a Message-ID, and without a date (an APPEND that set none), every message is a
  // candidate; with a date, the server narrows them to the days around it.
  if (id.empty() && !s->internaldate) return Summarise(s, "1:*");
  s->in_mailbox([s, id](Status st) {
    if (!st.ok()) return s->done(st);
    auto found = [s](Result<std::vector<std::uint32_t>> r) {
      if (!r.ok()) return s->done(r.status());
      if (r->empty()) return s->done(0u);
      std::string set;
      for (std::uint32_t u : *r) set += (set.empty() ? "" : ",") + std::to_string(u);
      Summarise(s, set);
    };
    if (id.empty()) return s->client.UidSearchNearDate(s->internaldate, found);
    s->client.UidSearchHeader("Message-ID", id, found);
  });
}

void FindAppendedIn(ImapClient& client, std::shared_ptr<const std::string> body, std::int64_t internaldate,
                    std::vector<std::string> mailboxes, SelectMailbox select,
                    std::function<void(Result<std::string>)> done) {
  // Without the APPEND's INTERNALDATE an older copy (a reader's COPY) is not told from ours.
  if (!internaldate) return done(std::string());
  // One mailbox at a time; the first that holds the message ends the search. Each search's
  // callback holds the chain (`self`) while its mailbox is asked; the chain holds only a weak
  // reference to itself.
  using Step = std::function<void(std::size_t)>;
  auto boxes = std::make_shared<const std::vector<std::string>>(std::move(mailboxes));
  auto next = std::make_shared<Step>();
  *next = [&client, body, internaldate, boxes, select = std::move(select), done = std::move(done),
           weak = std::weak_ptr<Step>(next)](std::size_t i) {
    if (i == boxes->size()) return done(std::string());
    const std::string& wire = (*boxes)[i];
    InMailbox in_mailbox = [select, wire](std::function<void(Status)> step) { select(wire, std::move(step)); };
    FindAppended(client, body, internaldate, std::move(in_mailbox),
                 [done, wire, i, self = weak.lock()](Result<std::uint32_t> uid) {
                   if (!uid.ok()) return done(uid.status());
                   if (*uid != 0) return done(wire);
                   (*self)(i + 1);
                 });
  };
  (*next)(0);
}

}  // namespace ghost
