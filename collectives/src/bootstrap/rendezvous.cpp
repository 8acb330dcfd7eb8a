#include "bootstrap/rendezvous.h"

#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <sstream>
#include <thread>

#include "net/socket.h"

namespace hpcdl {
namespace {

// How long a walking rank gives one candidate to accept and send its challenge before trying the next.
constexpr auto kWalkAttempt = std::chrono::seconds(3);

std::map<std::string, std::string> parse_lines(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

bool parse_int(const std::string& s, long* out) {
  if (s.empty() || s.size() > 12) return false;
  char* end = nullptr;
  *out = std::strtol(s.c_str(), &end, 10);
  return end && *end == '\0';
}

// Longest table or refusal a rank accepts from the rendezvous (a table line is well under 200 bytes for
// host names of usual length; the bound keeps a broken server from making a rank allocate without end).
constexpr uint32_t kMaxTableBytes = 1u << 24;

bool is_ipv4(const std::string& text) {
  in_addr parsed{};
  return inet_pton(AF_INET, text.c_str(), &parsed) == 1;
}

// Whether a registered rank's connection is still open. A rank sends nothing after registering, so a
// readable socket means it closed (or broke the protocol).
bool connection_open(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) < 0) return true;
  return (p.revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL)) == 0;
}

std::string hex(const uint8_t* data, size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) out += std::string{digits[data[i] >> 4], digits[data[i] & 15]};
  return out;
}

bool unhex(const std::string& text, std::string* out) {
  auto value = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  out->clear();
  if (text.size() % 2) return false;
  for (size_t i = 0; i < text.size(); i += 2) {
    int hi = value(text[i]), lo = value(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    *out += char(hi << 4 | lo);
  }
  return true;
}

// "29501, 29503-29516": runs of three or more consecutive ports as ranges.
std::string ports_text(const std::vector<int>& ports) {
  std::string out;
  for (size_t i = 0; i < ports.size();) {
    size_t end = i + 1;
    while (end < ports.size() && ports[end] == ports[end - 1] + 1) ++end;
    std::string run = std::to_string(ports[i]);
    if (end - i >= 3)
      run += "-" + std::to_string(ports[end - 1]);
    else
      end = i + 1;
    out += (out.empty() ? "" : ", ") + run;
    i = end;
  }
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

// ---- server ------------------------------------------------------------------------------------------

bool RendezvousServer::Registration::on_server_host() const {
  return seen == reached || is_loopback_address(seen);  // a connection to itself comes from its own address
}

Status RendezvousServer::start(const std::string& host, const std::vector<int>& ports, const std::string& secret,
                               int size, const std::string& job, const std::string& origin) {
  if (size < 1) return Status::error(HPCDL_ERR_INVALID, "rendezvous server: size must be at least 1");
  Status st = check_job_secret(secret);
  if (!st.is_ok()) return Status::error(st.code, "rendezvous server: " + st.message);
  if (ports.empty()) return Status::error(HPCDL_ERR_INVALID, "rendezvous server: no port to listen on");
  size_ = size;
  job_ = job;
  // It holds every registered rank's connection until the round completes, besides open handshakes.
  st = ensure_open_files(size_t(size) + kMaxPendingHandshakes,
                                "the rendezvous of " + std::to_string(size) + " ranks");
  if (!st.is_ok()) return st;
  int listen_errno = 0;
  for (int port : ports) {
    st = server_.start(
        host, port, secret,
        [this](int fd, const std::string& header, const Digest& session) { on_client(fd, header, session); },
        [this] { send_progress(); }, &listen_errno);
    if (st.is_ok() || listen_errno != EADDRINUSE) return st;
  }
  const std::string from = origin.empty() ? "" : " (from " + origin + ")";
  if (ports.size() == 1)
    return Status::error(HPCDL_ERR_INVALID, "port " + std::to_string(ports[0]) + " is taken on this host (" +
                                                st.message + "); it is the fixed rendezvous port" + from +
                                                ": choose a port that is free on this host");
  return Status::error(HPCDL_ERR_INVALID, "every port it may use, " + ports_text(ports) + from +
                                              ", is taken on this host; free one of them or give another port");
}

// Tells the waiting ranks, about once a second, who has arrived, so that a rank that gives up can name
// the ranks it waited for.
void RendezvousServer::send_progress() {
  auto now = Clock::now();
  if (now - last_progress_ < std::chrono::seconds(1)) return;
  last_progress_ = now;
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text = "progress=";
  for (auto& entry : round_) text += std::to_string(entry.first) + ",";
  text += "\n";
  for (auto& entry : round_)
    entry.second.session.send(text, now + std::chrono::milliseconds(100), "rank " + std::to_string(entry.first),
                              "rendezvous progress");
}

void RendezvousServer::stop() {
  server_.stop();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& entry : round_) close(entry.second.session.fd());
  round_.clear();
}

std::vector<int> RendezvousServer::arrived() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> out;
  if (round_.empty()) return std::vector<int>(last_complete_.begin(), last_complete_.end());
  for (auto& entry : round_) out.push_back(entry.first);
  return out;
}

void RendezvousServer::on_client(int fd, const std::string& header, const Digest& session) {
  auto fields = parse_lines(header);
  Session channel(fd, session, Session::Side::kServer);
  auto refuse = [&channel](const std::string& line) {
    channel.send(line + "\n", Clock::now() + std::chrono::seconds(2), "a registering rank", "rendezvous");
    close(channel.fd());
  };
  if (!job_.empty() && fields["job"] != job_) {
    // Another job walking the same ports with the same secret: it moves on to its own rendezvous.
    refuse("foreign=this rendezvous serves job '" + job_ + "', not '" + fields["job"] + "'");
    return;
  }
  long rank = -1, size = -1, port = 0, pid = 0;
  if (fields["purpose"] != "register" || !parse_int(fields["rank"], &rank) || !parse_int(fields["size"], &size) ||
      size != size_ || rank < 0 || rank >= size_) {
    // An authenticated but inconsistent client (e.g. launched with another size): tell it why.
    refuse("error=the rendezvous expects " + std::to_string(size_) + " ranks; this rank registered as " +
           fields["rank"] + " of " + fields["size"]);
    return;
  }
  Registration reg;
  reg.session = channel;
  reg.info.rank = int(rank);
  reg.info.host = fields["host"];
  reg.info.addr = fields["addr"];
  bool ok = parse_int(fields["port"], &port) && port > 0 && port < 65536 && parse_int(fields["pid"], &pid) &&
            pid >= 0 && !reg.info.host.empty() && (reg.info.addr.empty() || is_ipv4(reg.info.addr));
  for (char c : reg.info.host)
    if (c == '\t' || c == '\n') ok = false;
  if (!ok) {
    refuse("error=rank " + std::to_string(rank) + " registered an unusable host '" + reg.info.host +
           "', address '" + reg.info.addr + "' or port '" + fields["port"] + "'");
    return;
  }
  reg.info.port = int(port);
  reg.info.pid = int(pid);
  reg.seen = socket_peer_address(fd);
  reg.reached = socket_local_address(fd);
  std::vector<Registration> complete;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = round_.find(reg.info.rank);
    if (it != round_.end()) {
      const PeerInfo& first = it->second.info;
      if (connection_open(it->second.session.fd())) {
        refuse("error=rank " + std::to_string(rank) + " is already registered, by process " +
               std::to_string(first.pid) + " on host '" + first.host + "' (from " + it->second.seen +
               "); two processes claim rank " + std::to_string(rank) +
               ". Check that the launcher starts every rank once, with its own rank number");
        return;
      }
      close(it->second.session.fd());  // the first registration's process is gone: this one replaces it
    }
    round_[reg.info.rank] = reg;
    if (int(round_.size()) < size_) return;
    // The round would complete: a rank that has gone since it registered (a restarted process) must not be
    // in the table; its rank waits for the new registration.
    for (auto it = round_.begin(); it != round_.end();) {
      if (connection_open(it->second.session.fd())) {
        ++it;
      } else {
        close(it->second.session.fd());
        it = round_.erase(it);
      }
    }
    if (int(round_.size()) < size_) return;
    last_complete_.clear();
    for (auto& entry : round_) {
      complete.push_back(entry.second);
      last_complete_.insert(entry.first);
    }
    round_.clear();
  }
  finish_round(complete);
}

// Why the registered ranks could not work together at the addresses they gave, or "".
std::string RendezvousServer::address_problem(const std::vector<Registration>& round) {
  // A machine is named by the address its ranks connected from ("": the server's own machine).
  auto machine = [](const Registration& r) { return r.on_server_host() ? std::string() : r.seen; };
  auto describe = [](const std::string& m) { return m.empty() ? std::string("the rendezvous server's host") : m; };
  std::map<std::string, const Registration*> first_of_host;
  std::set<std::string> machines;
  const Registration* pinned_loopback = nullptr;
  for (const auto& r : round) {
    machines.insert(machine(r));
    if (!r.info.addr.empty() && is_loopback_address(r.info.addr) && !pinned_loopback) pinned_loopback = &r;
    auto inserted = first_of_host.emplace(r.info.host, &r);
    const Registration& other = *inserted.first->second;
    if (!inserted.second && machine(other) != machine(r))
      return "ranks " + std::to_string(other.info.rank) + " and " + std::to_string(r.info.rank) +
             " both call their host '" + r.info.host + "' but run on different machines (they reached the " +
             "rendezvous from " + describe(machine(other)) + " and " + describe(machine(r)) +
             "), so they cannot share memory; give every host its own hostname or set HPCDL_HOSTNAME per host";
  }
  if (pinned_loopback && machines.size() > 1)
    return "rank " + std::to_string(pinned_loopback->info.rank) + " on host '" + pinned_loopback->info.host +
           "' pinned its data address to the loopback address " + pinned_loopback->info.addr +
           " (HPCDL_IFACE), which ranks on the job's " + std::to_string(machines.size()) +
           " other hosts cannot reach; set HPCDL_IFACE to an interface of the network between the hosts, or "
           "leave it unset";
  return "";
}

// Sends every rank the table. Entries of ranks that reached the server from its own host, without a pinned
// address, are marked local: a rank on another host reaches them at the address it reached the server at
// ("via"); a rank on the server's host uses the address they came from (possibly loopback).
void RendezvousServer::finish_round(std::vector<Registration>& round) {
  std::string problem = address_problem(round);
  uint8_t nonce[32];
  Status drawn = random_bytes(nonce, sizeof(nonce));
  if (!drawn.is_ok()) problem = "the rendezvous server could not make the round's nonce: " + drawn.message;
  std::string table = "size=" + std::to_string(size_) + "\nnonce=" + hex(nonce, sizeof(nonce)) + "\n";
  for (const auto& r : round) {
    const bool derived = r.info.addr.empty();
    table += "peer=" + std::to_string(r.info.rank) + "\t" + r.info.host + "\t" + (derived ? r.seen : r.info.addr) +
             "\t" + std::to_string(r.info.port) + "\t" + std::to_string(r.info.pid) + "\t" +
             (derived && r.on_server_host() ? "local" : "") + "\n";
  }
  for (auto& r : round) {
    std::string text = problem.empty() ? "via=" + r.reached + "\nlocal=" + (r.on_server_host() ? "1" : "0") + "\n" + table
                                       : "error=" + problem + "\n";
    r.session.send(text, Clock::now() + std::chrono::seconds(5), "rank " + std::to_string(r.info.rank), "rendezvous");
    close(r.session.fd());
  }
}

// ---- client ------------------------------------------------------------------------------------------
namespace {

// Reads the table the server sent, refusing one this rank cannot use rather than indexing or connecting
// with what it says (the server is authenticated, but may run another version or be broken).
Status parse_table(const std::string& text, int size, Meeting* meeting) {
  auto bad = [](const std::string& why) {
    return Status::error(HPCDL_ERR_INVALID, "the rendezvous sent a table this rank cannot use (" + why +
                                                "); is the rendezvous server the same version of hpcdl?");
  };
  auto fields = parse_lines(text);
  if (fields["size"] != std::to_string(size)) return bad("it lists a job of '" + fields["size"] + "' ranks");
  if (fields["nonce"].size() != 64 || !unhex(fields["nonce"], &meeting->nonce)) return bad("no round nonce");
  const bool me_local = fields["local"] == "1";
  if (!me_local && !is_ipv4(fields["via"])) return bad("no usable address of the rendezvous host");
  std::vector<PeerInfo>& peers = meeting->peers;
  peers.assign(size_t(size), PeerInfo{});
  std::vector<bool> listed(size_t(size), false);
  std::istringstream in(text);
  std::string line;
  int seen = 0;
  while (std::getline(in, line)) {
    if (line.rfind("peer=", 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream cells_in(line.substr(5));
    for (std::string cell; std::getline(cells_in, cell, '\t');) cells.push_back(cell);
    if (cells.size() == 5) cells.emplace_back();  // an empty last cell (not local)
    long rank = -1, port = 0, pid = 0;
    if (cells.size() != 6 || !parse_int(cells[0], &rank) || rank < 0 || rank >= size || listed[size_t(rank)])
      return bad("a missing, repeated or out-of-range rank in '" + line.substr(0, 80) + "'");
    if (!parse_int(cells[3], &port) || port <= 0 || port > 65535 || !parse_int(cells[4], &pid) || pid < 0 ||
        cells[1].empty() || !is_ipv4(cells[2]) || (!cells[5].empty() && cells[5] != "local"))
      return bad("an unusable entry for rank " + std::to_string(rank));
    PeerInfo& p = peers[size_t(rank)];
    p.rank = int(rank);
    p.host = cells[1];
    p.addr = cells[5] == "local" && !me_local ? fields["via"] : cells[2];
    p.port = int(port);
    p.pid = int(pid);
    listed[size_t(rank)] = true;
    ++seen;
  }
  if (seen != size) return bad(std::to_string(seen) + " of the " + std::to_string(size) + " ranks");
  return Status::ok();
}

// What a rank was told after registering.
struct Answer {
  Status status;         // failure to get an answer, or the server's refusal
  bool foreign = false;  // the server belongs to another job
  std::string arrived;   // the last progress report ("0,2,")
};

// Waits for the table on an authenticated, registered connection (progress frames come first).
Answer await_table(Session& session, const std::string& where, int size, Deadline deadline, Meeting* meeting) {
  Answer answer;
  std::string text;
  Status& st = answer.status;
  while (true) {
    st = session.recv(&text, kMaxTableBytes, deadline, where,
                      "waiting at the rendezvous for all " + std::to_string(size) + " ranks");
    if (!st.is_ok()) return answer;
    if (text.rfind("progress=", 0) != 0) break;
    answer.arrived = text.substr(9);
  }
  auto fields = parse_lines(text);
  if (fields.count("foreign")) {
    answer.foreign = true;
    st = Status::error(HPCDL_ERR_AUTH, where + " is not this job's: " + fields["foreign"]);
  } else if (fields.count("error")) {
    st = Status::error(HPCDL_ERR_INVALID, "the rendezvous refused this rank: " + fields["error"]);
  } else {
    st = parse_table(text, size, meeting);
  }
  return answer;
}

// Advice for a rank whose rendezvous address is a loopback address on its host.
std::string loopback_hint(const RendezvousTarget& target, const PeerInfo& self) {
  for (const auto& addr : target.addrs) {
    std::string resolved;
    if (!resolve_address(addr, &resolved).is_ok() || !is_loopback_address(resolved)) continue;
    const std::string which = addr == resolved ? "The rendezvous address " + addr + " is"
                                               : "The rendezvous address '" + addr + "' resolves to " + resolved +
                                                     " on this host (" + self.host + "),";
    return ". " + which + " a loopback address: ranks on other hosts cannot reach a rendezvous there, and "
           "this rank reaches only one on its own host. If the job spans hosts, set " +
           (target.origin.empty() ? "the rendezvous address" : target.origin) +
           " to a name or address of rank 0's host that resolves to its network address on every host";
  }
  return "";
}

Status timed_out(const RendezvousTarget& target, const PeerInfo& self, int size, const std::string& where,
                 const std::string& arrived) {
  std::string missing;
  for (int r = 0; r < size; ++r)
    if (("," + arrived).find("," + std::to_string(r) + ",") == std::string::npos)
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  return Status::error(HPCDL_ERR_TIMEOUT, "rank " + std::to_string(self.rank) + " waited at " + where +
                                              " until its deadline (HPCDL_TIMEOUT) for all " + std::to_string(size) +
                                              " ranks" + (arrived.empty() ? std::string() : "; still missing: rank " + missing) +
                                              ". Check that every rank was started, with the same size, secret and "
                                              "rendezvous address" + loopback_hint(target, self));
}

// What one candidate of a walk answered, in words, from the failure of connecting (`connected` false) or
// of authenticating with `where`.
std::string outcome(const Status& st, bool connected, const std::string& where) {
  if (!connected) return st.code == HPCDL_ERR_TIMEOUT ? "no answer to connecting" : "refused or unreachable";
  if (st.code == HPCDL_ERR_TIMEOUT) return "no handshake within " + std::to_string(kWalkAttempt.count()) + " s";
  const std::string prefix = "authenticating with " + where + ": ";
  return st.message.rfind(prefix, 0) == 0 ? st.message.substr(prefix.size()) : st.message;
}

}  // namespace

Status rendezvous_register(const RendezvousTarget& target, const std::string& secret, const std::string& job,
                           int size, const PeerInfo& self, Deadline deadline, Meeting* meeting) {
  const std::string header = "purpose=register\nrank=" + std::to_string(self.rank) + "\nsize=" + std::to_string(size) +
                             "\njob=" + job + "\nhost=" + self.host + "\naddr=" + self.addr +
                             "\nport=" + std::to_string(self.port) + "\npid=" + std::to_string(self.pid) + "\n";
  const std::string who = "rank " + std::to_string(self.rank);
  if (target.addrs.empty() || target.ports.empty())
    return Status::error(HPCDL_ERR_INVALID, "no rendezvous address to register at");
  if (target.addrs.size() == 1 && target.ports.size() == 1) {
    const std::string where = "the rendezvous server at " + target.addrs[0] + ":" + std::to_string(target.ports[0]);
    int fd = -1;
    Digest key{};
    Status st = connect_authenticated(target.addrs[0], target.ports[0], secret, header, deadline, where, &fd, &key);
    if (!st.is_ok()) {
      if (st.code == HPCDL_ERR_TIMEOUT) st.message = who + ": " + st.message + loopback_hint(target, self);
      return st;
    }
    Session session(fd, key, Session::Side::kClient);
    Answer answer = await_table(session, where, size, deadline, meeting);
    close(fd);
    if (answer.status.code == HPCDL_ERR_TIMEOUT) return timed_out(target, self, size, where, answer.arrived);
    return answer.status;
  }
  // A walk: each pass tries every candidate once; a candidate that is not this job's rendezvous is passed over.
  std::map<std::string, std::vector<std::pair<std::string, int>>> answered;  // what -> the candidates that did
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    answered.clear();
    for (const auto& addr : target.addrs) {
      for (int port : target.ports) {
        const std::string where = "the rendezvous at " + addr + ":" + std::to_string(port);
        const Deadline attempt_by = std::min(deadline, Clock::now() + kWalkAttempt);
        int fd = -1;
        Status st = connect_tcp(addr, port, attempt_by, who + " looking for " + where, &fd, false);
        if (st.code == HPCDL_ERR_INVALID) return st;  // the name does not resolve
        const bool connected = st.is_ok();
        Digest key{};
        if (connected) st = auth_client(fd, secret, header, attempt_by, where, &key);
        if (st.is_ok()) {
          Session session(fd, key, Session::Side::kClient);
          Answer answer = await_table(session, where, size, deadline, meeting);
          close(fd);
          if (answer.status.code == HPCDL_ERR_TIMEOUT) return timed_out(target, self, size, where, answer.arrived);
          if (!answer.foreign) return answer.status;
          st = Status::error(HPCDL_ERR_AUTH, "the rendezvous of another job");
        } else if (fd >= 0) {
          close(fd);
        }
        answered[outcome(st, connected, where)].emplace_back(addr, port);
      }
    }
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  std::string answers;
  for (const auto& entry : answered) {
    std::vector<int> ports;
    std::vector<std::string> candidates;
    for (const auto& c : entry.second) {
      ports.push_back(c.second);
      candidates.push_back(c.first + ":" + std::to_string(c.second));
    }
    answers += (answers.empty() ? "" : "; ") + (target.addrs.size() > 1 ? join(candidates) : ports_text(ports)) +
               ": " + entry.first;
  }
  return Status::error(
      HPCDL_ERR_TIMEOUT,
      who + " found no rendezvous of this job at " + join(target.addrs) + " on port" +
          (target.ports.size() > 1 ? "s " : " ") + ports_text(target.ports) +
          (target.origin.empty() ? "" : " (from " + target.origin + ")") +
          " before its deadline (HPCDL_TIMEOUT); rank 0 serves on the first of them that is free on its host. "
          "What they answered: " + answers + ". Check that rank 0 started and that every rank has the same " +
          "secret and size" + loopback_hint(target, self));
}

}  // namespace hpcdl
