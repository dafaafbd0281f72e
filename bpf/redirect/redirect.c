// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Connect-time redirect for sockscale.
//
// A TCP connect() to a Service address (ClusterIP:port, IPv4 or IPv6) that
// has an entry in `services` goes to one of the entry's backends instead,
// chosen per connection by weight; getpeername() on that socket still
// returns the address the client dialled. Proxy mode is an entry whose
// backends are the target's activators (equal weights); a traffic split is
// an entry whose backends are revisions' Service addresses with their
// weights; a revision's address with an entry of its own (Proxy mode) is
// followed to its backend (MAX_HOPS). Every other connect, and every UDP
// socket, is left alone.
//
// Programs, attached once at a cgroup v2 root (every socket below it):
//
//   sockscale_connect4      cgroup/connect4      rewrites the destination
//   sockscale_getpeername4  cgroup/getpeername4  gives back the dialled address
//   sockscale_connect6      cgroup/connect6      the same for IPv6 sockets: an IPv6
//   sockscale_getpeername6  cgroup/getpeername6  ClusterIP, or ::ffff:<ClusterIP>
//
// Addresses. Keys and backends hold 16-byte addresses: IPv6 as it is,
// IPv4 as IPv4-mapped (::ffff:a.b.c.d). So connect4's 10.96.0.10 and a
// dual-stack socket's ::ffff:10.96.0.10 are the same key. A connect keeps
// its family: an IPv4 destination (connect4, or a mapped one in connect6)
// only goes to a mapped backend, a native IPv6 one only to a native IPv6
// backend; an entry whose backend is of the other family is refused and
// the connect left alone (the agent never writes one).
//
// Maps:
//
//   services    Service address -> weighted backends (the agent writes it)
//   origins     per socket: the address dialled and the backend chosen
//   redirected  per Service, per CPU: connects redirected (the agent reads it)
//   events      per CPU: how often an unusual path was taken (enum event)
//   lease       until when the entries may be followed (the agent renews it)
//
// Why a lease. The maps and links are pinned, so the entries outlive the
// agent that wrote them: across a restart that is what keeps Proxy mode in
// the kernel, but an agent that stays down (crash loop, node drained of it,
// the chart uninstalled) would leave entries nobody updates, still sending
// connects to activators that may be gone. The agent renews the lease each
// time it has made the map equal to the cluster (every resync, 10 s by
// default) for a few periods ahead; once it lapses, entries are ignored and
// connects take kube-proxy's path, which the public EndpointSlices keep
// correct on their own. A connect to an address without an entry never
// reads the lease.
//
// Why one update of an entry is atomic for the program. An entry is one
// value: the backends, their count and their total weight together, and a
// bpf_spin_lock. The agent replaces it with one BPF_MAP_UPDATE_ELEM with
// BPF_F_LOCK, which copies the new value over the old one in place while
// holding the entry's lock; the program picks a backend while holding the
// same lock. So a connect sees the whole old entry or the whole new one,
// never count from one and backends from the other. (Without the lock a hash
// update swaps in a new element under RCU, which readers see whole, but the
// old element is recycled at once -- the updating CPU's spare element, or the
// allocator's free list -- so a reader still inside it could see the next
// update's bytes.) Deleting an entry frees its element at once too, and an
// insert of another Service may reuse it while a connect that looked it up
// just before still holds the pointer. So the entry carries its own key and
// the program refuses an entry whose key is not the one it looked up. That
// narrows the race without closing it -- an insert copies its value without
// the lock -- but what is left needs a delete and an insert of another
// Service on the same CPU within the few hundred nanoseconds between a
// connect's lookup and its pick, which every reader of a BPF hash map shares.
//
// Minimum kernel: 5.8 for the getpeername hooks; the loader fails with the
// verifier's reason on a kernel that lacks socket storage or bpf_spin_lock
// for cgroup sock_addr programs. Tested on 6.18.

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_SERVICES 16384 // Service addresses with an entry, per node
#define MAX_BACKENDS 32    // backends per entry (an activator subset, a split)
#define MAX_WEIGHT 65535   // a backend's weight: 1..MAX_WEIGHT
#define MAX_HOPS 2         // entries a connect follows: a split, then a revision in Proxy mode

// An address of either family, as the accounting object writes it: IPv6
// as it is, IPv4 as IPv4-mapped ::ffff:a.b.c.d; network order, word by
// word as the socket address holds it.
struct ip_addr {
	__u32 w[4];
};

// A Service address. Also the key of the redirected counters.
struct svc_key {
	struct ip_addr ip; // IPv6, or IPv4-mapped
	__u16 port;        // network order
	__u16 pad;         // zero: keys are compared as bytes
};

struct backend {
	struct ip_addr ip; // of the family of the entry's key (see the top comment)
	__u16 port;        // network order
	__u16 weight;      // 1..MAX_WEIGHT for the first count backends, 0 beyond
};

struct svc_entry {
	struct bpf_spin_lock lock; // held by the program while picking, by the agent's BPF_F_LOCK update while copying
	__u32 count;               // backends in use, 1..MAX_BACKENDS
	__u32 total;               // the sum of their weights
	struct svc_key svc;        // the entry's own key (see the top comment)
	struct backend backends[MAX_BACKENDS];
};

// What connect4 or connect6 did to a socket, for getpeername4 or 6.
struct origin {
	struct svc_key dialled; // the Service address the client asked for
	struct svc_key backend; // where it was sent instead
};

enum event {
	EV_ENTRY_REFUSED, // an entry was unusable: recycled for another key, no backend matched, or one of the other family
	EV_NO_ORIGIN,     // no socket storage for the origin: getpeername shows the backend
	EV_COUNTER_LOST,  // redirected is full: this Service's connects are not counted
	EV_LEASE_EXPIRED, // an entry was ignored: the agent's lease on the map has lapsed
	EV_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SERVICES);
	__uint(map_flags, BPF_F_NO_PREALLOC); // memory for the entries in use only
	__type(key, struct svc_key);          // Service address
	__type(value, struct svc_entry);      // its backends, see the struct
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC); // required for socket storage
	__type(key, int);                     // the socket (the kernel's key)
	__type(value, struct origin);         // set by connect4/6 when they redirect
} origins SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MAX_SERVICES);
	__uint(map_flags, BPF_F_NO_PREALLOC); // a counter per Service ever redirected, not per possible one
	__type(key, struct svc_key);          // Service address
	__type(value, __u64);                 // connects redirected on this CPU
} redirected SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EV_MAX);
	__type(key, __u32);   // enum event
	__type(value, __u64); // how often it happened on this CPU
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);   // 0
	__type(value, __u64); // CLOCK_BOOTTIME ns until which entries are followed
} lease SEC(".maps");

char __license[] SEC("license") = "Dual MIT/GPL";

// lease_holds reports whether the agent's lease on the entries is current.
// Boot time, not monotonic: it keeps counting while the machine sleeps, so
// a lease does not outlive its wall-clock length across a suspend.
static __always_inline int lease_holds(void)
{
	__u32 zero = 0;
	__u64 *until = bpf_map_lookup_elem(&lease, &zero);

	// NULL cannot happen for index 0 of an array; the verifier needs the check.
	return until && bpf_ktime_get_boot_ns() < *until;
}

// count_event adds one to ev's counter on this CPU.
static __always_inline void count_event(__u32 ev)
{
	__u64 *n = bpf_map_lookup_elem(&events, &ev);
	// The verifier needs the NULL check even though ev < EV_MAX always.
	if (n)
		*n += 1;
}

// count_redirect adds one to svc's redirected counter on this CPU, creating
// the counter on the Service's first redirect.
static __always_inline void count_redirect(const struct svc_key *svc)
{
	__u64 one = 1;
	__u64 *n = bpf_map_lookup_elem(&redirected, svc);

	// NULL: the first redirect of this Service (or the counter was dropped).
	if (n) {
		*n += 1;
		return;
	}
	// NOEXIST: another CPU may be creating it right now; then add to theirs.
	if (bpf_map_update_elem(&redirected, svc, &one, BPF_NOEXIST) == 0)
		return;
	n = bpf_map_lookup_elem(&redirected, svc);
	// NULL again: the map is full.
	if (n)
		*n += 1;
	else
		count_event(EV_COUNTER_LOST);
}

// v4_mapped reports whether a is an IPv4-mapped address (::ffff:a.b.c.d).
static __always_inline int v4_mapped(const struct ip_addr *a)
{
	return a->w[0] == 0 && a->w[1] == 0 && a->w[2] == bpf_htonl(0xffff);
}

// same_addr reports whether a and b are the same address.
static __always_inline int same_addr(const struct ip_addr *a, const struct ip_addr *b)
{
	return a->w[0] == b->w[0] && a->w[1] == b->w[1] && a->w[2] == b->w[2] && a->w[3] == b->w[3];
}

// unspecified reports whether a is :: or ::ffff:0.0.0.0, which no backend
// is: connecting there would reach this host, not a backend.
static __always_inline int unspecified(const struct ip_addr *a)
{
	return a->w[3] == 0 && a->w[0] == 0 && a->w[1] == 0 && (a->w[2] == 0 || a->w[2] == bpf_htonl(0xffff));
}

// pick chooses a backend of e for the random number r: r scaled to
// [0, total) falls into one backend's share of the cumulative weights.
// Returns 1 and fills *to, or 0 and leaves *to alone if e is not an entry
// for svc (it was recycled) or no backend matched (an entry the agent
// would never write).
static __always_inline int pick(struct svc_entry *e, const struct svc_key *svc, __u32 r, struct svc_key *to)
{
	struct svc_key got = {};
	int found = 0;
	__u32 n, x;

	// No helper calls and no return while the lock is held (verifier).
	bpf_spin_lock(&e->lock);
	if (!same_addr(&e->svc.ip, &svc->ip) || e->svc.port != svc->port)
		goto out;
	n = e->count;
	// Multiply-shift scales r to [0, total) without a division: each
	// backend gets a run of the 2^32 values of r within one value of
	// weight/total of them (TestPickModelShares checks the Go model).
	x = ((__u64)r * e->total) >> 32;
	// The constant bound is what the verifier checks the loop against
	// and keeps the index within backends[]; count ends it early.
	for (__u32 i = 0; i < MAX_BACKENDS; i++) {
		if (i >= n)
			break;
		if (x < e->backends[i].weight) {
			got.ip = e->backends[i].ip;
			got.port = e->backends[i].port;
			found = 1;
			break;
		}
		x -= e->backends[i].weight;
	}
out:
	bpf_spin_unlock(&e->lock);
	// An unspecified address or port 0 is never written by the agent;
	// refuse it rather than connect there.
	if (!found || unspecified(&got.ip) || got.port == 0)
		return 0;
	*to = got;
	return 1;
}

// redirect picks a backend for a TCP connect to svc, if svc has an entry:
// it remembers the dialled address in the socket's storage, counts the
// redirect and returns 1 with *to filled. Returns 0 if the connect stays
// as it is: no entry (one hash miss, the common case) or an unusable one.
// The backend is of svc's family (both IPv4-mapped or neither): the
// caller's socket address can only be rewritten within its family, so a
// backend of the other family refuses the entry.
//
// A backend may be a Service address with an entry of its own: a traffic
// split's revision whose Service is in Proxy mode. The connect then goes
// on to that entry's backend, up to MAX_HOPS entries deep; the bound keeps
// an entry cycle finite (the verifier needs one anyway). Each entry passed
// counts a redirect.
static __always_inline int redirect(struct bpf_sock_addr *ctx, const struct svc_key *svc, struct svc_key *to)
{
	struct svc_key hop = *svc, next = {};
	int mapped = v4_mapped(&svc->ip);
	struct svc_entry *e;
	struct origin *o;
	int hops = 0;

	for (int i = 0; i < MAX_HOPS; i++) {
		e = bpf_map_lookup_elem(&services, &hop);
		// NULL: not a Service with an entry.
		if (!e)
			break;
		// Only an address with an entry pays for the lease check.
		if (i == 0 && !lease_holds()) {
			count_event(EV_LEASE_EXPIRED);
			break;
		}
		// bpf_get_prandom_u32 before pick: no helper calls under its lock.
		// Into next, not *to: a refused second hop leaves the first's.
		if (!pick(e, &hop, bpf_get_prandom_u32(), &next)) {
			count_event(EV_ENTRY_REFUSED);
			break;
		}
		// The agent never mixes families in an entry; the program does
		// not trust that: an IPv4 socket address cannot hold an IPv6
		// backend, and the reverse would change the socket's family.
		if (v4_mapped(&next.ip) != mapped) {
			count_event(EV_ENTRY_REFUSED);
			break;
		}
		count_redirect(&hop);
		*to = next;
		hop = next;
		hops++;
	}
	if (hops == 0)
		return 0;
	o = bpf_sk_storage_get(&origins, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	// NULL: no memory for the storage. Redirect anyway; only getpeername
	// will show the backend.
	if (o) {
		o->dialled = *svc;
		o->backend = *to;
	} else {
		count_event(EV_NO_ORIGIN);
	}
	return 1;
}

// Program sockscale_connect4.
// Hook: cgroup/connect4 (BPF_CGROUP_INET4_CONNECT), at the cgroup v2 root.
// Rewrites a TCP connect to a Service address with an entry to one of its
// backends (see redirect). UDP returns before any lookup; a TCP connect to
// any other address costs one hash miss. Always allows the connect
// (returns 1): a redirect that cannot be done leaves it as it was.
// Minimum kernel: the object's (top comment); the hook itself is 4.17.
SEC("cgroup/connect4")
int sockscale_connect4(struct bpf_sock_addr *ctx)
{
	struct svc_key svc = {}, to = {};

	if (ctx->protocol != IPPROTO_TCP)
		return 1;
	// The key's form of an IPv4 address: ::ffff:<user_ip4>.
	svc.ip.w[2] = bpf_htonl(0xffff);
	svc.ip.w[3] = ctx->user_ip4;
	// user_port holds the port in network order in its low 16 bits.
	svc.port = (__u16)ctx->user_port;
	if (!redirect(ctx, &svc, &to))
		return 1;
	ctx->user_ip4 = to.ip.w[3]; // redirect gave a mapped backend: its IPv4 word
	ctx->user_port = to.port;   // a 4-byte store, as the verifier requires for this field
	return 1;
}

// Program sockscale_connect6.
// Hook: cgroup/connect6 (BPF_CGROUP_INET6_CONNECT), at the cgroup v2 root.
// connect4 for IPv6 sockets: a connect to an IPv6 ClusterIP, and one of a
// client whose runtime opens IPv6 sockets for every address (Java, .NET)
// to ::ffff:<ClusterIP>, which is IPv4 on the wire, never reaches
// connect4, and is the same key as connect4's. The destination is looked
// up as it is; redirect keeps the family, so the rewrite of all four words
// keeps a mapped destination mapped. Returns 1 like connect4.
// Minimum kernel: the object's (top comment); the hook itself is 4.17.
SEC("cgroup/connect6")
int sockscale_connect6(struct bpf_sock_addr *ctx)
{
	struct svc_key svc = {}, to = {};

	if (ctx->protocol != IPPROTO_TCP)
		return 1;
	// 4-byte loads and stores: what the verifier allows for user_ip6.
	svc.ip.w[0] = ctx->user_ip6[0];
	svc.ip.w[1] = ctx->user_ip6[1];
	svc.ip.w[2] = ctx->user_ip6[2];
	svc.ip.w[3] = ctx->user_ip6[3];
	svc.port = (__u16)ctx->user_port;
	if (!redirect(ctx, &svc, &to))
		return 1;
	ctx->user_ip6[0] = to.ip.w[0];
	ctx->user_ip6[1] = to.ip.w[1];
	ctx->user_ip6[2] = to.ip.w[2];
	ctx->user_ip6[3] = to.ip.w[3];
	ctx->user_port = to.port;
	return 1;
}

// origin_of returns the storage of a socket connect4 or connect6
// redirected to ip:port, or NULL: never redirected, or redirected and then
// connected again elsewhere (a socket whose redirected connect failed may
// try another address; its storage then describes the old attempt).
static __always_inline struct origin *origin_of(struct bpf_sock_addr *ctx, const struct ip_addr *ip, __u16 port)
{
	struct origin *o = bpf_sk_storage_get(&origins, ctx->sk, 0, 0);

	// NULL: connect4/6 never redirected this socket.
	if (!o)
		return 0;
	// Another peer: the socket connected again after a failed redirect.
	if (!same_addr(ip, &o->backend.ip) || port != o->backend.port)
		return 0;
	return o;
}

// Program sockscale_getpeername4.
// Hook: cgroup/getpeername4 (BPF_CGROUP_INET4_GETPEERNAME), at the cgroup
// v2 root. For a socket connect4 redirected, returns the address the client
// dialled instead of the backend's, so applications, TLS checks and logs see
// no difference. Other sockets cost one socket-storage miss. Must return 1.
// Minimum kernel: 5.8 (the hook).
SEC("cgroup/getpeername4")
int sockscale_getpeername4(struct bpf_sock_addr *ctx)
{
	struct ip_addr peer = {};
	struct origin *o;

	// connect4 kept the mapped form: ::ffff:<user_ip4>.
	peer.w[2] = bpf_htonl(0xffff);
	peer.w[3] = ctx->user_ip4;
	o = origin_of(ctx, &peer, (__u16)ctx->user_port);
	if (!o)
		return 1;
	ctx->user_ip4 = o->dialled.ip.w[3]; // mapped too: connect4 dialled it
	ctx->user_port = o->dialled.port;
	return 1;
}

// Program sockscale_getpeername6.
// Hook: cgroup/getpeername6 (BPF_CGROUP_INET6_GETPEERNAME), at the cgroup
// v2 root. getpeername4 for the IPv6 sockets connect6 redirected: the peer
// is the backend (IPv6, or ::ffff:<backend> for a dual-stack socket) and
// becomes the dialled address, of the same family. Must return 1.
// Minimum kernel: 5.8 (the hook).
SEC("cgroup/getpeername6")
int sockscale_getpeername6(struct bpf_sock_addr *ctx)
{
	struct ip_addr peer;
	struct origin *o;

	peer.w[0] = ctx->user_ip6[0];
	peer.w[1] = ctx->user_ip6[1];
	peer.w[2] = ctx->user_ip6[2];
	peer.w[3] = ctx->user_ip6[3];
	o = origin_of(ctx, &peer, (__u16)ctx->user_port);
	if (!o)
		return 1;
	ctx->user_ip6[0] = o->dialled.ip.w[0];
	ctx->user_ip6[1] = o->dialled.ip.w[1];
	ctx->user_ip6[2] = o->dialled.ip.w[2];
	ctx->user_ip6[3] = o->dialled.ip.w[3];
	ctx->user_port = o->dialled.port;
	return 1;
}
