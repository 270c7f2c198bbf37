// The durable outbox. See common/imap/outbox.h.
#include "common/imap/outbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <fstream>
#include <sstream>

namespace ghost {

namespace {

Status WriteDurably(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, "creating " + path);
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Status::FromErrno(errno, "writing " + path);
      ::close(fd);
      return s;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    Status s = Status::FromErrno(errno, "fsync of " + path);
    ::close(fd);
    return s;
  }
  ::close(fd);
  return Status::Ok();
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "opening " + dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  return rc == 0 ? Status::Ok() : Status::FromErrno(err, "fsync of " + dir);
}

std::vector<std::string> Names(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > suffix.size() && n.ends_with(suffix)) out.push_back(n.substr(0, n.size() - suffix.size()));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// `id` is the name the envelope is stored under (<id>.json). Every field is checked for its
// type (nlohmann's value() throws on a wrong one), and the id inside must be that name: it
// names the files Remove, Refuse and DataPath touch.
Result<OutboxMessage> ReadEnvelope(const std::string& path, const std::string& id) {
  std::ifstream f(path);
  if (!f) return Status::IoError("cannot read " + path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(path + " is not an outbox envelope");
  auto bad = [&](const char* key, const char* want) {
    return Status::Corruption(path + ": \"" + key + "\" must be " + want);
  };
  auto text = [&](const char* key, std::string* out) {
    auto it = j.find(key);
    if (it == j.end()) return true;
    if (!it->is_string()) return false;
    *out = it->get<std::string>();
    return true;
  };
  OutboxMessage m;
  if (!text("id", &m.id)) return bad("id", "a string");
  if (m.id != id) return Status::Corruption(path + ": its \"id\" is not its file's name (" + id + ")");
  if (!text("from", &m.from)) return bad("from", "a string");
  if (!text("user", &m.user)) return bad("user", "a string");
  if (!text("reply", &m.reply)) return bad("reply", "a string");
  if (auto it = j.find("rcpts"); it != j.end()) {
    if (!it->is_array()) return bad("rcpts", "an array of strings");
    for (const auto& r : *it) {
      if (!r.is_string()) return bad("rcpts", "an array of strings");
      m.rcpts.push_back(r.get<std::string>());
    }
  }
  if (auto it = j.find("size"); it != j.end()) {
    if (!it->is_number_unsigned()) return bad("size", "a byte count");
    m.size = it->get<Bytes>();
  }
  if (auto it = j.find("received_unix"); it != j.end()) {
    if (!it->is_number_integer()) return bad("received_unix", "an integer");
    m.received_unix = it->get<std::int64_t>();
  }
  if (auto it = j.find("refused"); it != j.end()) {
    if (!it->is_boolean()) return bad("refused", "true or false");
    m.refused = it->get<bool>();
  }
  return m;
}

}  // namespace

nlohmann::json OutboxMessage::ToJson() const {
  nlohmann::json j = {{"id", id},       {"from", from}, {"rcpts", rcpts},
                      {"user", user},   {"size", size}, {"received_unix", received_unix},
                      {"refused", refused}};
  if (refused) j["reply"] = reply;
  return j;
}

Result<std::unique_ptr<Outbox>> Outbox::Open(const std::string& dir) {
  for (const std::string& d : {dir, dir + "/tmp", dir + "/msg", dir + "/refused"}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, "creating the outbox directory " + d);
  }
  std::unique_ptr<Outbox> o(new Outbox(dir));
  for (const std::string& n : Names(dir + "/tmp", "")) ::unlink((dir + "/tmp/" + n).c_str());
  std::vector<std::string> envelopes = Names(dir + "/msg", ".json");
  for (const std::string& id : Names(dir + "/msg", ".eml")) {
    if (!std::binary_search(envelopes.begin(), envelopes.end(), id)) {
      ::unlink((dir + "/msg/" + id + ".eml").c_str());  // a put that did not finish
    }
  }
  for (const std::string& id : envelopes) {
    Result<OutboxMessage> m = ReadEnvelope(dir + "/msg/" + id + ".json", id);
    if (!m.ok()) return m.status();
    o->waiting_.push_back(*m);
  }
  return o;
}

Result<OutboxMessage> Outbox::Put(const std::string& from, const std::vector<std::string>& rcpts,
                                  const std::string& user, const std::string& data) {
  OutboxMessage m;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  char id[64];
  std::snprintf(id, sizeof id, "%lld.%09ld.%d.%llu", static_cast<long long>(now.tv_sec), now.tv_nsec,
                static_cast<int>(::getpid()), static_cast<unsigned long long>(++counter_));
  m.id = id;
  m.from = from;
  m.rcpts = rcpts;
  m.user = user;
  m.size = data.size();
  m.received_unix = now.tv_sec;
  const std::string tmp = dir_ + "/tmp/" + m.id, msg = dir_ + "/msg/" + m.id;
  auto undo = [&] {
    ::unlink((tmp + ".eml").c_str());
    ::unlink((tmp + ".json").c_str());
    ::unlink((msg + ".eml").c_str());
  };
  // The envelope is JSON: bytes that are not UTF-8 cannot be kept in it as they are (nlohmann's
  // dump throws), and an address must not be altered. Refused before anything is written.
  std::string envelope;
  try {
    envelope = m.ToJson().dump();
  } catch (const nlohmann::json::exception&) {
    return Status::InvalidArgument("the sender, a recipient or the user is not UTF-8");
  }
  Status s = WriteDurably(tmp + ".eml", data);
  if (s.ok()) s = WriteDurably(tmp + ".json", envelope);
  if (s.ok() && ::rename((tmp + ".eml").c_str(), (msg + ".eml").c_str()) != 0)
    s = Status::FromErrno(errno, "moving " + tmp + ".eml into the outbox");
  if (s.ok() && ::rename((tmp + ".json").c_str(), (msg + ".json").c_str()) != 0)
    s = Status::FromErrno(errno, "moving " + tmp + ".json into the outbox");
  if (s.ok()) s = SyncDir(dir_ + "/msg");
  if (!s.ok()) {
    undo();
    return s;
  }
  waiting_.push_back(m);
  return m;
}

Status Outbox::Remove(const std::string& id) {
  const std::string msg = dir_ + "/msg/" + id;
  // The envelope goes first: an .eml alone is an incomplete put, removed at the next Open.
  if (::unlink((msg + ".json").c_str()) != 0 && errno != ENOENT)
    return Status::FromErrno(errno, "removing " + msg + ".json");
  ::unlink((msg + ".eml").c_str());
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [&](const OutboxMessage& m) { return m.id == id; }),
                 waiting_.end());
  return SyncDir(dir_ + "/msg");
}

Status Outbox::Refuse(const std::string& id, const std::string& reply) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const OutboxMessage& m) { return m.id == id; });
  if (it == waiting_.end()) return Status::NotFound("no waiting message " + id);
  OutboxMessage m = *it;
  m.refused = true;
  m.reply = reply;
  const std::string from = dir_ + "/msg/" + id, to = dir_ + "/refused/" + id;
  if (::rename((from + ".eml").c_str(), (to + ".eml").c_str()) != 0)
    return Status::FromErrno(errno, "moving " + from + ".eml to refused/");
  // The server's reply is only shown: bytes that are not UTF-8 become U+FFFD (a plain dump throws).
  Status s = WriteDurably(to + ".json", m.ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  if (!s.ok()) return s;
  ::unlink((from + ".json").c_str());
  if (Status d = SyncDir(dir_ + "/refused"); !d.ok()) return d;
  waiting_.erase(it);
  return SyncDir(dir_ + "/msg");
}

Bytes Outbox::waiting_bytes() const {
  Bytes total = 0;
  for (const OutboxMessage& m : waiting_) total += m.size;
  return total;
}

Result<nlohmann::json> ListOutbox(const std::string& dir) {
  struct stat st{};
  if (::stat((dir + "/msg").c_str(), &st) != 0)
    return Status::FromErrno(errno, dir + " is not an outbox (no msg/ in it; see ghostproxy --smtp-outbox)");
  nlohmann::json out = {{"waiting", nlohmann::json::array()}, {"refused", nlohmann::json::array()}};
  for (const char* kind : {"msg", "refused"}) {
    std::string sub = dir + "/" + kind;
    for (const std::string& id : Names(sub, ".json")) {
      Result<OutboxMessage> m = ReadEnvelope(sub + "/" + id + ".json", id);
      if (!m.ok()) continue;
      out[std::string(kind) == "msg" ? "waiting" : "refused"].push_back(m->ToJson());
    }
  }
  // A message being refused is in both directories for a moment: it is refused.
  nlohmann::json waiting = nlohmann::json::array();
  for (const auto& w : out["waiting"]) {
    bool refused = false;
    for (const auto& r : out["refused"]) refused = refused || r["id"] == w["id"];
    if (!refused) waiting.push_back(w);
  }
  out["waiting"] = waiting;
  return out;
}

}  // namespace ghost
