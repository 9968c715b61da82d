// Package egress is the network a job can be trusted with: an egress proxy
// that alone serves a job's sandbox, and decides every connection and DNS
// query by the job's policy. It holds no job state: the engine implements
// Policies (and Asker and Sink) and the proxy asks it, by the job's token,
// at every attempt.
//
// # What it decides
//
// A Policy is None (nothing), Egress (every name and public address) or
// Allowlist (names: "pypi.org", "*.pythonhosted.org", "github.com:443").
// Whatever the policy, a job never reaches link-local addresses
// (169.254.0.0/16, with cloud metadata; fe80::/10; fd00:ec2::254), the
// host's own addresses (loopback, unspecified, every interface's) except
// Config.Callback, multicast and reserved ranges, or, unless the operator
// sets Config.AllowPrivate, 10/8, 172.16/12, 192.168/16, 100.64/10 and
// fc00::/7 (Config.Allow lifts single ranges). The proxy resolves names
// itself (keeping a job's answers for the 30 s its resolver tells the job
// to keep them, so that a job is connected where it was told), filters
// the addresses, connects only to those, and checks the address once more
// as the socket connects (net.Dialer.ControlContext): a name that rebinds
// to metadata gets nowhere, whatever the job's DNS said.
//
// A job reaches the proxy in three ways: the proxy variables (Serve: HTTP
// CONNECT and plain HTTP), redirected connections of clients that ignore
// them (ServeTransparent: the TLS ClientHello's SNI, read without
// decrypting, or the HTTP Host header names the destination; the port is
// where the client connected; TLS without SNI or with an encrypted
// ClientHello is refused), and its resolver (ServeDNS, ServeDNSStream: A
// and AAAA for allowed names, with allowed addresses only; NXDOMAIN for the
// rest; no query is forwarded as the job wrote it). Under an allowlist a
// CONNECT tunnel's first ClientHello must name the host the tunnel was
// opened to, so that an allowed name on a shared front end (a CDN) does
// not carry another; a tunnel whose client speaks plain HTTP (a known
// method and a space first) is served request by request, each naming the
// tunnel's host and port in its Host (421 otherwise).
//
// Credentials the sandbox never holds: an operator's NAME_INJECT binding
// (ParseBinding) sends a secret to one host, in one header. For that host
// alone the proxy stands in with the job's own CA (NewCA: made per job,
// name-constrained to the injected hosts, no IP addresses), verifies the
// real host against the system roots (Config.RootCAs), sets the header on
// every request (replacing the job's), only over verified HTTPS, only when
// the request's Host is that host; the secret prints as "[secret]"
// everywhere and is never logged.
//
// Limits, so that one job cannot take the server's descriptors: a job
// holds at most Config.MaxConnsPerJob connections at once (every listener
// of its sandbox and the shared one together) and opens at most
// Config.ConnRate a second (a burst of twice as many); all jobs together
// hold at most Config.MaxConns, by default a quarter of the server's
// open-file limit (two descriptors a connection: the proxy never holds
// more than half, the rest runs jobs). A connection over a limit is closed
// at once (503 on the shared listener) and logged, at most once a second
// per job. A tunnel that carries no byte either way for Config.IdleTimeout
// ends, as does a request's head not read within 30 s.
//
// Every attempt is an Entry of the job's network log, delivered to a Sink
// through a bounded queue (Config.LogQueue; what a slow sink loses is
// counted and reported). A request the allowlist denies may wait
// (Policy.Ask, Config.AskWait, 30 s) for the Asker's answer; it goes
// through if the policy allows it by then. Retries of a request wait on
// one question, and a job has at most 8 waiting: a job that tries many
// names cannot flood the person asked.
//
// # The engine's part
//
//   - Per job: a random token of its own for the network (not the callback
//     token: a proxy URL with it must let nothing else in), its Policy
//     stored with the job, and for a job with injected secrets a CA from
//     NewCA(hosts, timeout+margin), kept with CA.MarshalPEM so that a
//     restarted server serves the same CA (ParseCA), destroyed at the end.
//   - The sandbox's trust bundle is the system roots plus CA.CertPEM, named
//     by SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, GIT_SSL_CAINFO
//     and NODE_EXTRA_CA_CERTS. A bound secret goes in no environment: the
//     job gets a placeholder (NAME=delegate-injected) and Binding.Inject
//     goes in Policy.Inject. ParseBinding runs at start-up, so that a bad
//     binding stops the server with a message naming the key and the field.
//   - Widening (MCP, CLI, an answer to a question): Policy.Widen, store the
//     result, Proxy.PolicyChanged (which wakes held requests and logs the
//     change for the timeline).
//   - At the end: Policies answers ErrUnknownToken, Proxy.Revoke closes the
//     job's connections, the sandbox's listeners' contexts end, the CA is
//     destroyed.
//
// # Local sandboxes: the only route is to the proxy
//
// Choice: per-sandbox listeners opened inside the sandbox's own network
// namespace, and no interface that leaves it — neither a veth or tap pair
// nor pasta or slirp4netns. The namespace keeps only its loopback, with
// every destination routed to it:
//
//	ip link set lo up
//	ip route add local 0.0.0.0/0 dev lo
//	ip -6 route add local ::/0 dev lo
//
// so a connection to any address lands on a socket of the namespace, whose
// local address is where the job meant to go. The server's listeners in it:
// 3128 (Serve: http_proxy and https_proxy are http://10.0.2.2:3128; any
// address reaches it), 80 and 443 (ServeTransparent), 53 over UDP and TCP
// (ServeDNS, ServeDNSStream; resolv.conf's nameserver 10.0.2.3, and a
// resolver hard-coded by the job, 8.8.8.8 say, reaches it too), and the
// callback port (ServeCallback, forwarding to Config.Callback; the job's
// DELEGATE_CALLBACK_URL is http://10.0.2.2:PORT). Any other port refuses
// the connection inside the namespace; a UDP datagram to anything but 53
// meets no socket; ICMP goes nowhere. The tests build exactly this (see
// newSandbox) and prove it with curl, git, pip and raw sockets.
//
// Why this and not the others:
//   - Nothing to get around: the namespace has no route out at all, and
//     the job (no capabilities in its user namespace, seccomp) cannot add
//     one. pasta and slirp4netns give the job a NATed route to whatever the
//     host reaches, with no filter on destinations (their options close the
//     host's loopback, not 169.254.169.254, private ranges or the host's
//     other addresses: issue 23's attack went through both); keeping them
//     beside the proxy would leave a second road to police.
//   - Nothing on the host: a veth pair needs an address, routes and
//     firewall rules in the host's namespace per sandbox, made with
//     CAP_NET_ADMIN at run time, and a rule forgotten is a hole; a tap adds
//     a user-space network stack. Here nothing is added to the host, and
//     nothing is left behind when a sandbox dies: the namespace goes with
//     it.
//   - Identity for free: a listener belongs to one sandbox, so
//     ServeTransparent and ServeDNS know the job without the client saying
//     anything (redirected clients and DNS queries cannot carry a token).
//   - No netfilter: REDIRECT or TPROXY would need nf_tables modules a
//     container may lack; local routes are core IPv4 and IPv6.
//   - The proxy runs unprivileged: its upstream sockets are the server's
//     own; only the listening sockets are made in the sandbox.
//
// What the local backend must do: (1) in the shim, where it starts pasta
// today, for a proxied job: bring lo up, add the two local routes
// (netlink; the shim is privileged in the sandbox's user namespace, which
// owns the network namespace), open the listening sockets inside the
// namespace, all before init goes on; (2) pass the listening descriptors
// to the server over the shim's control socket (SCM_RIGHTS) at start and
// again at Recover, keeping its own copies for the sandbox's life, so that
// a restarted server serves the same listeners (net.FileListener,
// net.FilePacketConn, then the Serve calls above with the job's token and a
// context that ends with the sandbox); (3) bind the resolv.conf above and
// set http_proxy, https_proxy, HTTP_PROXY, HTTPS_PROXY and
// no_proxy=localhost,127.0.0.1 in the job's environment, with the trust
// bundle; (4) run `egress` jobs through the proxy too (Policy{Mode:
// Egress}), so that metadata, the host and private ranges are closed to
// them as well, and declare the capability, so that the engine refuses an
// allowlist on a backend that cannot enforce it.
//
// # Proxmox: the proxy alone, behind each VM's firewall
//
// A VM cannot have a listener of its own, so it reaches one shared
// listener of the server's (Serve with token ""), and names its job in
// Proxy-Authorization: the job's environment holds
// https_proxy=http://job:TOKEN@PROXY:3128 (curl, pip, git and npm send it
// as Basic; Bearer is accepted too). Transparent mode and the sandbox's
// DNS are not offered to VMs: nothing in a redirected connection names a
// job. Clients with the proxy variables resolve nothing themselves; the
// others get nowhere. ClientAddr lets the engine also check that a token
// comes from its own VM's address, which ipfilter makes trustworthy.
//
// The backend sets, then reads back before the VM starts (refusing the
// job when it asks for an allowlist or injected secrets and any of it is
// missing):
//
//	net0: virtio=MAC,bridge=PROXMOX_JOB_BRIDGE,firewall=1
//	PUT  /nodes/{node}/qemu/{vmid}/firewall/options
//	     enable=1 ipfilter=1 macfilter=1 policy_in=DROP policy_out=DROP dhcp=0 radv=0
//	POST /nodes/{node}/qemu/{vmid}/firewall/ipset name=ipfilter-net0
//	POST /nodes/{node}/qemu/{vmid}/firewall/ipset/ipfilter-net0 cidr=VM_IP/32
//	POST /nodes/{node}/qemu/{vmid}/firewall/rules type=out action=ACCEPT proto=tcp dest=PROXY_IP dport=3128 enable=1
//	POST /nodes/{node}/qemu/{vmid}/firewall/rules type=out action=ACCEPT proto=tcp dest=CALLBACK_IP dport=CALLBACK_PORT enable=1
//
// ipfilter with the VM's (static, cloud-init ipconfig0) address pins the
// VM to it; policy_out DROP drops everything else, DNS and ICMP included;
// replies to the VM's own connections pass (the firewall tracks
// connections), and the guest agent, on virtio-serial, is not on the
// network. VM rules do nothing unless the datacenter's and the node's
// firewalls are on, so the backend checks GET /cluster/firewall/options
// (enable=1; off by default) and GET /nodes/{node}/firewall/options
// (enable, on by default) with Sys.Audit; setting the VM's rules needs
// VM.Config.Network (pve-manager's API schema), which the DelegateJobs role
// already has. A linked clone copies its template's firewall file, so the
// template may carry the rules; the backend still checks every clone.
//
// # Limits
//
//   - Only the hosts with injected credentials are decrypted; they speak
//     HTTP/1.1 to the job (ALPN), WebSocket upgrades included. A host that
//     echoes request headers back (httpbin-style) hands the credential to
//     the job: bind secrets to APIs, not to mirrors of requests.
//   - Inside a CONNECT tunnel only the first ClientHello is read: HTTP/2
//     connection coalescing, or plain HTTP in a tunnel, can still address
//     another site on the same front end, as with every CONNECT allowlist.
//   - A wildcard rule lets a job put data in the names it looks up below
//     the domain (DNS exfiltration to that domain's servers).
//   - Browsers may send a GREASE encrypted_client_hello, which cannot be
//     told from a real one and is refused where the proxy must see the
//     name (transparent TLS, tunnels under an allowlist): give Chromium the
//     proxy variables under egress, or turn ECH off.
//   - Transparent mode covers the ports with a listener (80, 443); other
//     ports need the proxy variables. QUIC (UDP 443) is dropped; clients
//     fall back to TCP.
package egress
