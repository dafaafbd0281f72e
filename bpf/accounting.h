// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Types and limits shared by the C (accounting.c and the files it includes)
// and, through bpf2go's -type, the Go loader and tests. The Go model of the
// parsers (model_test.go) mirrors the constants here; TestHeaderMatchesGo
// (header_test.go) checks that it does and that the hashes hash their strings.

#ifndef SOCKSCALE_ACCOUNTING_H
#define SOCKSCALE_ACCOUNTING_H

#define MAX_PODS 4096         // pods per node; kubelet's default limit is 110
#define MAX_ACTIVATORS 1024   // activator pods in the cluster

#define SCAN_WINDOW 64        // bytes parsed per bpf_loop call (stack buffer)
#define SCAN_STEPS 32         // request classifier steps (windows or header lines)
#define MAX_WINDOWS 256       // response parse steps per segment before giving up
#define MAX_METHOD 16         // longest HTTP method token accepted

// One kind of request (all, or proxied only) of one pod.
struct req_stats {
	__s64 in_flight;    // N: started and not completed
	__u64 started;      // requests started since the pod was added
	__u64 completed;    // requests completed since the pod was added
	__u64 start_sum_ns; // S: sum of the start times of the requests in flight
	__u64 done_sum_ns;  // C: sum of the durations of completed requests
};

// Per pod. The spin lock covers all and proxied, so user space reading with
// BPF_F_LOCK gets N, S and C of one instant; the rest are atomic adds.
struct pod_stats {
	struct bpf_spin_lock lock;
	__u32 _pad;
	__u64 id;                 // the pod's identity (hash of its UID), set by the agent
	struct req_stats all;     // every request, proxied ones included
	struct req_stats proxied; // requests whose client is an activator
	__s64 conns_in_flight;    // open server connections
	__u64 conns_total;        // connections accepted
	__s64 opaque_in_flight;   // open connections accounted at connection level
	__u64 opaque_total;       // connections that switched to connection level
	__u64 probes_total;       // health-probe requests, not counted as load
};

// The server side of one connection: sock_ops reads a new connection's
// addresses into it, and the test object's four-tuple map (lib/conn.h) is
// keyed by it.
struct conn_key {
	__u32 pod_ip;    // network order
	__u32 peer_ip;   // network order
	__u16 pod_port;  // network order
	__u16 peer_port; // network order
};

// Request states of a connection (conn.req).
enum {
	REQ_IDLE = 0,  // no request in flight: idle keep-alive is not load
	REQ_BUSY = 1,  // a counted request is in flight
	REQ_PROBE = 2, // a health probe is in flight (not load)
};

// Response parser states (conn.state).
enum {
	RS_STATUS = 0,    // before or in the status line's version
	RS_CODE,          // the three status digits
	RS_SKIP_LINE,     // rest of a line we do not care about
	RS_LINE_START,    // first byte of a header line
	RS_NAME,          // header name
	RS_CL_VALUE,      // Content-Length value
	RS_TE_VALUE,      // Transfer-Encoding value
	RS_HEADERS_LF,    // the LF of the empty line that ends the headers
	RS_BODY,          // Content-Length body bytes (skipped by count)
	RS_CHUNK_SIZE,    // hex chunk size
	RS_CHUNK_EXT,     // chunk extension, up to LF
	RS_CHUNK_DATA,    // chunk bytes (skipped by count)
	RS_CHUNK_END,     // CRLF after chunk data
	RS_TRAILER_START, // first byte of a trailer line (or the final CRLF)
	RS_TRAILER_SKIP,  // rest of a trailer line
	RS_TRAILER_LF,    // the LF of the final empty line
	RS_UNTIL_CLOSE,   // body delimited by the connection's end, or upgraded
};

// Header flags of the response being parsed (conn.hflags).
enum {
	HF_LENGTH = 1,  // Content-Length seen
	HF_CHUNKED = 2, // Transfer-Encoding: chunked
};

// Request classifier states.
enum {
	RQ_METHOD = 0,
	RQ_SKIP_LINE,
	RQ_LINE_START,
	RQ_NAME,
	RQ_UA_SPACE,
	RQ_UA_VALUE,
	RQ_DONE,
};

// Request classifier verdicts.
enum {
	VERDICT_REQUEST = 0, // an HTTP/1.x request that is load
	VERDICT_PROBE = 1,   // a health probe: not load
	VERDICT_OPAQUE = 2,  // not HTTP/1.x: account at connection level
};

// Tokens are recognised by their length and FNV-1a hash, so the parsers
// never index a string with a position (which would make the verifier track
// every position separately). header_test.go checks these against the strings.
#define FNV_OFFSET 0x811c9dc5u
#define FNV_PRIME 0x01000193u
#define HASH_HEAD 0x305a7fc3u              // "HEAD"
#define HASH_PRI 0xdb304beau               // "PRI", the HTTP/2 preface
#define HASH_USER_AGENT 0x24259beeu        // "user-agent"
#define HASH_KUBE_PROBE 0xba596f3cu        // "kube-probe/"
#define HASH_SOCKSCALE_PROBE 0x083e4e8bu   // "sockscale-probe/"
#define HASH_HTTP_VERSION 0x1b47a03eu      // "HTTP/"
#define HASH_CONTENT_LENGTH 0x4df9451du    // "content-length"
#define HASH_TRANSFER_ENCODING 0xddb4744cu // "transfer-encoding"
#define HASH_CHUNKED 0xd31f4213u           // "chunked"

// Largest segment we parse; GSO super-packets are at most 64 KiB. Keeping
// offsets in this range also lets the verifier see that every parse step
// starts from the same state, so it checks the step once.
#define MAX_SEGMENT 0xffff

struct conn {
	// Both directions read these on every segment and write a few of them
	// on every request: they share the value's first cache line (the kernel
	// puts a socket-storage value 8 bytes into a line, so that is 56 bytes).
	__u64 pod_id;       // the id in the pod's counters when accepted (see owner())
	__u64 req_start_ns; // start of the request in flight
	__u32 rx_next;      // next client sequence number not yet seen
	__u32 req;          // REQ_*, changed with cmpxchg
	__u32 slot;         // the pod's slot in pod_counters
	__u32 opaque;       // 1 once accounted at connection level
	__u32 closed;       // 1 once the end of the connection was counted
	__u8 proxied;       // the client is an activator
	__u8 head;          // the request in flight is HEAD
	__u8 seen;          // the client has sent bytes (so the server did not speak first)
	__u8 load;          // a request on it was load: later ones are too (see on_request_bytes)

	// Scratch of the parsers while one segment is processed. It lives in
	// the map value, not on the stack, because the verifier tracks constants
	// on the stack through the parse loops and would check every
	// combination of them; map values it treats as unknown. Egress runs are
	// serialised by the socket lock; two ingress runs of one connection can
	// overlap (the hook runs before TCP locks the socket), which at worst
	// misclassifies that request (probe or HEAD): start_request's cmpxchg
	// keeps the count exact.
	__u32 rx_off, rx_end; // request bytes not yet classified
	__u32 rx_skip;        // bytes of the window already classified
	__u32 rx_used;        // bytes of the window classified when bpf_loop stopped
	// From here on the second cache line: the response parser's, which
	// only egress touches on the common path.
	__u32 rx_hash;        // FNV-1a of the request token being matched
	__u8 rx_state;        // RQ_*
	__u8 rx_pos;          // length of the request token being matched
	__u8 rx_verdict;      // VERDICT_*
	__u8 _pad1;

	__u32 tx_next;      // next server sequence number not yet parsed
	__u32 hash;         // FNV-1a of the token being parsed
	__u16 status;       // status code of the response being parsed
	__u8 state;         // RS_*
	__u8 hflags;        // HF_*
	__u8 pos;           // length of the token being parsed (saturates at 255)
	__u8 _pad2[3];
	__u64 length;       // Content-Length or chunk size being parsed
	__u64 remaining;    // bytes left in the body or chunk being skipped
	__u32 tx_off, tx_end; // response bytes not yet parsed
	__u32 tx_skip;        // bytes of the window already parsed
	__u32 tx_used;        // bytes of the window parsed when bpf_loop stopped
	__u32 tx_done;        // responses completed in this segment
	__s32 tx_err;         // 0, PARSE_ERROR or PARSE_LIMIT
};

// Counted events that indicate limits or bugs; exported as agent metrics.
enum event {
	EV_CONN_UNTRACKED = 0, // a connection was not tracked: no memory for its state
	EV_PARSE_LIMIT,       // a segment needed more than MAX_WINDOWS steps
	EV_PARSE_ERROR,       // a response was not valid HTTP/1.x
	EV_MAX,
};

#endif
