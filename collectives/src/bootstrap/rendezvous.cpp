#include "bootstrap/rendezvous.h"

#include <unistd.h>

#include <sstream>

#include "net/socket.h"

namespace hpcdl {
namespace {

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

std::string encode_peer(const PeerInfo& p) {
  return "peer=" + std::to_string(p.rank) + "\t" + p.host + "\t" + p.addr + "\t" + std::to_string(p.port) + "\t" +
         std::to_string(p.pid) + "\n";
}

}  // namespace

Status RendezvousServer::start(const std::string& host, int port, const std::string& secret, int size) {
  if (size < 1) return Status::error(HPCDL_ERR_INVALID, "rendezvous server: size must be at least 1");
  size_ = size;
  return server_.start(
      host, port, secret, [this](int fd, const std::string& header) { on_client(fd, header); },
      [this] { send_progress(); });
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
  uint32_t len = uint32_t(text.size());
  std::string frame(reinterpret_cast<const char*>(&len), 4);
  frame += text;
  for (auto& entry : round_)
    send_all(entry.second.first, frame.data(), frame.size(), now + std::chrono::milliseconds(100), "rank",
             "rendezvous progress");
}

void RendezvousServer::stop() {
  server_.stop();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& entry : round_) close(entry.second.first);
  round_.clear();
}

std::vector<int> RendezvousServer::arrived() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> out;
  if (round_.empty()) return std::vector<int>(last_complete_.begin(), last_complete_.end());
  for (auto& entry : round_) out.push_back(entry.first);
  return out;
}

void RendezvousServer::on_client(int fd, const std::string& header) {
  auto fields = parse_lines(header);
  long rank = -1, size = -1, port = 0, pid = 0;
  bool ok = fields["purpose"] == "register" && parse_int(fields["rank"], &rank) &&
            parse_int(fields["size"], &size) && parse_int(fields["port"], &port) && parse_int(fields["pid"], &pid) &&
            size == size_ && rank >= 0 && rank < size_;
  PeerInfo info;
  info.rank = int(rank);
  info.host = fields["host"];
  info.addr = fields["addr"];
  info.port = int(port);
  info.pid = int(pid);
  for (char c : info.host + info.addr)
    if (c == '\t' || c == '\n') ok = false;
  if (!ok) {
    // An authenticated but inconsistent client (e.g. launched with another size): tell it why.
    std::string reason = "error=the rendezvous expects " + std::to_string(size_) + " ranks; this rank registered as " +
                         fields["rank"] + " of " + fields["size"] + "\n";
    uint32_t len = uint32_t(reason.size());
    send_all(fd, &len, 4, Clock::now() + std::chrono::seconds(2), "client", "rendezvous");
    send_all(fd, reason.data(), reason.size(), Clock::now() + std::chrono::seconds(2), "client", "rendezvous");
    close(fd);
    return;
  }
  std::vector<std::pair<int, PeerInfo>> complete;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = round_.find(info.rank);
    if (it != round_.end()) close(it->second.first);  // the rank restarted: keep the newest registration
    round_[info.rank] = {fd, info};
    if (int(round_.size()) < size_) return;
    for (auto& entry : round_) complete.push_back(entry.second);
    last_complete_.clear();
    for (auto& entry : round_) last_complete_.insert(entry.first);
    round_.clear();
  }
  std::string table = "size=" + std::to_string(size_) + "\n";
  for (auto& entry : complete) table += encode_peer(entry.second);
  uint32_t len = uint32_t(table.size());
  for (auto& entry : complete) {
    auto deadline = Clock::now() + std::chrono::seconds(5);
    Status st = send_all(entry.first, &len, 4, deadline, "rank", "rendezvous");
    if (st.is_ok()) send_all(entry.first, table.data(), table.size(), deadline, "rank", "rendezvous");
    close(entry.first);
  }
}

Status rendezvous_register(const std::string& addr, int port, const std::string& secret, int size,
                           const PeerInfo& self, Deadline deadline, std::vector<PeerInfo>* peers) {
  const std::string where = "the rendezvous server at " + addr + ":" + std::to_string(port);
  int fd = -1;
  Status st = connect_tcp(addr, port, deadline, "rank " + std::to_string(self.rank) + " reaching " + where, &fd);
  if (!st.is_ok()) return st;
  std::string header = "purpose=register\nrank=" + std::to_string(self.rank) + "\nsize=" + std::to_string(size) +
                       "\nhost=" + self.host + "\naddr=" + self.addr + "\nport=" + std::to_string(self.port) +
                       "\npid=" + std::to_string(self.pid) + "\n";
  st = auth_client(fd, secret, header, deadline, where);
  if (!st.is_ok()) {
    close(fd);
    return st;
  }
  std::string table, arrived;
  while (st.is_ok()) {  // progress frames ("progress=0,2,"), then the table
    uint32_t len = 0;
    st = recv_all(fd, &len, 4, deadline, where, "waiting at the rendezvous for all " + std::to_string(size) + " ranks");
    if (st.is_ok() && len > (1u << 24)) st = Status::error(HPCDL_ERR_INTERNAL, "rendezvous: oversized message");
    if (!st.is_ok()) break;
    table.assign(len, '\0');
    st = recv_all(fd, &table[0], len, deadline, where, "reading the rendezvous table");
    if (!st.is_ok() || table.rfind("progress=", 0) != 0) break;
    arrived = table.substr(9);
  }
  close(fd);
  if (!st.is_ok()) {
    if (st.code == HPCDL_ERR_TIMEOUT) {
      std::string missing;
      for (int r = 0; r < size; ++r)
        if (("," + arrived).find("," + std::to_string(r) + ",") == std::string::npos)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      st.message = "rank " + std::to_string(self.rank) + " waited at " + where + " until its deadline " +
                   "(HPCDL_TIMEOUT) for all " + std::to_string(size) + " ranks" +
                   (arrived.empty() ? std::string() : "; still missing: rank " + missing) +
                   ". Check that every rank was started, with the same size, secret and rendezvous address";
    }
    return st;
  }
  auto fields = parse_lines(table);
  if (fields.count("error")) return Status::error(HPCDL_ERR_INVALID, "rendezvous refused this rank: " + fields["error"]);
  peers->assign(size_t(size), PeerInfo{});
  std::istringstream in(table);
  std::string line;
  int seen = 0;
  while (std::getline(in, line)) {
    if (line.rfind("peer=", 0) != 0) continue;
    std::istringstream fields_in(line.substr(5));
    PeerInfo p;
    std::string rank, port_text, pid;
    std::getline(fields_in, rank, '\t');
    std::getline(fields_in, p.host, '\t');
    std::getline(fields_in, p.addr, '\t');
    std::getline(fields_in, port_text, '\t');
    std::getline(fields_in, pid, '\t');
    p.rank = std::atoi(rank.c_str());
    p.port = std::atoi(port_text.c_str());
    p.pid = std::atoi(pid.c_str());
    if (p.rank < 0 || p.rank >= size) return Status::error(HPCDL_ERR_INTERNAL, "rendezvous: bad table");
    (*peers)[size_t(p.rank)] = p;
    ++seen;
  }
  if (seen != size) return Status::error(HPCDL_ERR_INTERNAL, "rendezvous: incomplete table");
  return Status::ok();
}

}  // namespace hpcdl
