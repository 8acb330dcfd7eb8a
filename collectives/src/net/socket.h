// TCP sockets with deadlines: every call that can block takes a Deadline and says what it waited for.
#pragma once

#include <string>
#include <vector>

#include "comm.h"

namespace hpcdl {

std::string errno_text(int err);

// Non-blocking listening socket on host:port (port 0: any free port). Returns the fd or -1 with *error
// (and, when given, *error_number: the errno of the failed call, e.g. EADDRINUSE).
int listen_tcp(const std::string& host, int port, int* bound_port, std::string* error, int* error_number = nullptr);
// Connects to host:port, retrying refused connections until the deadline (the peer may not listen yet);
// with retry_refused=false, one attempt.
// `congestion` (when not empty) is the connection's congestion control (set_congestion_control).
Status connect_tcp(const std::string& host, int port, Deadline deadline, const std::string& what, int* fd,
                   bool retry_refused = true, const std::string& congestion = "");
void configure_data_socket(int fd);  // non-blocking, TCP_NODELAY, large buffers
// TCP_CONGESTION of a socket before it connects or listens (connections accepted by a listener inherit it);
// set later, the connection keeps the pacing the first algorithm asked for. "" and "system" leave the
// system's default. Where the system does not allow the algorithm (not loaded, or not in
// net.ipv4.tcp_allowed_congestion_control for an unprivileged process) the socket keeps the default too:
// congestion_control_for says which one a socket gets.
void set_congestion_control(int fd, const std::string& name);
std::string congestion_control_for(const std::string& name);
std::string socket_local_address(int fd);  // this side's IPv4 address of a connected socket
std::string socket_peer_address(int fd);   // the other side's
// The IPv4 address `host` (a name or an address) resolves to on this host.
Status resolve_address(const std::string& host, std::string* address);
bool is_loopback_address(const std::string& ipv4);  // 127.0.0.0/8
// IPv4 addresses of this host's interfaces that are up, loopback last.
std::vector<std::string> host_addresses();
// IPv4 address of a network interface name ("eth0"), or the argument itself when it already is one.
Status interface_address(const std::string& iface, std::string* address);

// Raises this process's soft limit on open files (RLIMIT_NOFILE) so that `more` descriptors fit beyond the
// ones open now; fails, naming `what` and the limits, when the hard limit does not allow it.
Status ensure_open_files(size_t more, const std::string& what);

// Blocking-with-deadline transfers on non-blocking sockets. `peer` names the other side in errors.
Status send_all(int fd, const void* data, size_t size, Deadline deadline, const std::string& peer,
                const std::string& what);
Status recv_all(int fd, void* data, size_t size, Deadline deadline, const std::string& peer,
                const std::string& what);
// Sends to one socket while receiving from another (possibly the same), so that rings cannot deadlock.
Status send_recv(int send_fd, const void* send_data, size_t send_size, const std::string& send_peer, int recv_fd,
                 void* recv_data, size_t recv_size, const std::string& recv_peer, Deadline deadline,
                 const std::string& what);

// The errors of a data transfer: `peer` names the other side.
Status peer_lost(const std::string& peer, const std::string& what, const std::string& detail);
Status peer_timed_out(const std::string& peer, const std::string& what, const char* direction);

// Milliseconds left until the deadline for poll(), clamped to [0, INT_MAX].
int poll_timeout_ms(Deadline deadline);

}  // namespace hpcdl
