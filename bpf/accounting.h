// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Types and limits shared by the C (accounting.c and the files it includes)
// and, through bpf2go's -type, the Go loader and tests. The Go model of the
// parsers (model_test.go) mirrors the constants here; TestHeaderMatchesGo
// (header_test.go) checks that it does and that the hashes hash their strings.

#ifndef SOCKSCALE_ACCOUNTING_H
#define SOCKSCALE_ACCOUNTING_H

#define MAX_PODS 4096         // pods per node; kubelet's default limit is 110
#define MAX_ACTIVATORS 1024   // activator pods in the cluster
#define MAX_NODE_ADDRS 256    // addresses of the node itself (its health probes come from one)
#define MAX_LEARNED 65536     // connections the agent found in the socket table before the programs saw them
#define MAX_DRAINING 65536    // connections of leaving pods whose next response asks the client to close

#define SCAN_WINDOW 64        // bytes parsed per bpf_loop call (stack buffer)
#define MAX_WINDOWS 256       // parse steps per segment and direction before the parser gives up
#define MAX_METHOD 16         // longest HTTP method token accepted
#define SKIP_LINES 8          // header lines that do not matter skipped per parse step
#define MAX_PIPELINE 16       // requests in flight on one connection followed one by one (a power of two)
#define PROOF_WINDOWS 4       // windows searched for the end of a request line that resynchronises
#define MAX_STASHED 4096      // connections whose first bytes reached the listening socket, until accepted
#define TENURE_NONE (~0ULL)   // a connection's tenure until count_accepted confirms its pod: no slot's
#define MAX_H2_STREAMS 128    // HTTP/2 streams in flight on one connection followed one by one
#define MAX_H2_FRAMES 4096    // HTTP/2 frame steps per segment and direction before the walk gives up
#define MAX_H2_STASHED 256    // HTTP/2 connections whose first frames reached the listening socket, until accepted
#define MAX_RX_WAIT 65536     // tries of a client segment to take its connection from another CPU's walk

// An address of either family as the maps keep it, in network order: an
// IPv6 address as it is, an IPv4 address IPv4-mapped (::ffff:a.b.c.d). One
// key type for both families, and an IPv4 client of a socket that listens
// on [::] has the same key as one of a plain IPv4 socket.
struct ip_addr {
	__u32 w[4];
};

// One kind of request (all, or proxied only) of one pod.
struct req_stats {
	__s64 in_flight;    // N: started and not completed
	__u64 started;      // requests started since the pod was added
	__u64 completed;    // requests completed since the pod was added
	__u64 start_sum_ns; // S: sum of the start times of the requests in flight
	__u64 done_sum_ns;  // C: sum of the durations of completed requests
};

// Per pod. The spin lock covers every field: the programs change them under
// it, and the agent writes and reads the whole value with BPF_F_LOCK, so it
// gets N, S and C of one instant (see lib/counters.h).
struct pod_stats {
	struct bpf_spin_lock lock;
	struct ip_addr ip;        // the pod's address this slot counts for, set by the agent with id
	__u64 id;                 // the pod's identity (hash of its UID), set by the agent
	__u64 tenure;             // new at each reset by the agent: which connections count here (see owner())
	struct req_stats all;     // every request, proxied ones included
	struct req_stats proxied; // requests whose client is an activator
	__s64 conns_in_flight;    // open server connections
	__u64 conns_total;        // connections accepted
	__s64 opaque_in_flight;   // open connections accounted at connection level
	__u64 opaque_total;       // connections that switched to connection level
	__u64 probes_total;       // health-probe requests, not counted as load
	__u64 learned_gone;       // connections the agent learned (see learned_conn) whose first segment came since
	__s64 h2_in_flight;       // open connections whose HTTP/2 streams are followed (lib/h2.h)
	__u64 h2_total;           // connections followed as HTTP/2
};

// A connection the agent found open in the kernel's socket table with no
// state of ours (opened before the programs ran or before its pod was
// added): the agent counts it (conn_adjust) until its first segment, when
// the programs take it over (lib/adopt.h) and count learned_gone up.
struct learned_conn {
	__u64 tenure; // the tenure of the pod's slot when learned (see owner())
	__u32 slot;   // the pod's slot in pod_counters
	__u32 _pad;
};

// The agent's own correction of a slot's open connections, which only the
// agent writes: connections it learned (+1 each) or found gone (-1). A slot
// reports conns_in_flight - learned_gone + conns while tenure matches.
struct conn_adjust {
	__u64 tenure; // the slot's tenure this correction is for
	__s64 conns;  // connections added to the programs' count
};

// The server side of one connection: sock_ops reads a new connection's
// addresses into it, and the test object's four-tuple map (lib/conn.h) is
// keyed by it.
struct conn_key {
	struct ip_addr pod_ip;
	struct ip_addr peer_ip;
	__u16 pod_port;  // network order
	__u16 peer_port; // network order
};

// Message parser states (msg.state), for requests (conn.rx) and responses
// (conn.tx). The start line has states of its own per direction; header
// lines, bodies and chunks are parsed alike in both.
enum {
	MS_START = 0,     // requests: before a request line (stray CR and LF skipped);
	                  // responses: before or in the status line's version
	MS_METHOD,        // requests: the method
	MS_CODE,          // responses: the three status digits
	MS_SKIP_LINE,     // rest of a line we do not care about (request line, reason, header)
	MS_LINE_START,    // first byte of a header line
	MS_NAME,          // header name
	MS_CL_VALUE,      // Content-Length value
	MS_TE_VALUE,      // Transfer-Encoding value
	MS_UA_SPACE,      // requests being classified: spaces before the User-Agent value
	MS_UA_VALUE,      // requests being classified: the User-Agent value
	MS_HEADERS_LF,    // the LF of the empty line that ends the headers
	MS_BODY,          // Content-Length body bytes (skipped by count)
	MS_CHUNK_SIZE,    // hex chunk size
	MS_CHUNK_EXT,     // chunk extension, up to LF
	MS_CHUNK_DATA,    // chunk bytes (skipped by count)
	MS_CHUNK_END,     // CRLF after chunk data
	MS_TRAILER_START, // first byte of a trailer line (or the final CRLF)
	MS_TRAILER_SKIP,  // rest of a trailer line
	MS_TRAILER_LF,    // the LF of the final empty line
	MS_UNTIL_CLOSE,   // responses: body delimited by the connection's end, or upgraded
	MS_LOST,          // the stream was lost: waiting for a point to resynchronise at
};

// Header flags of the message being parsed (msg.hflags).
enum {
	HF_LENGTH = 1,   // Content-Length seen
	HF_CHUNKED = 2,  // Transfer-Encoding: chunked
	HF_CLASSIFY = 4, // requests: still looking for a probe's User-Agent
	HF_BEGUN = 8,    // requests: begun, its headers not yet all in (not counted yet)
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

// The parse state of one direction's messages.
struct msg {
	__u64 length;    // Content-Length or chunk size being parsed
	__u64 remaining; // bytes left in the body or chunk being skipped
	__u32 hash;      // FNV-1a of the token being parsed
	__u16 status;    // responses: status code being parsed
	__u8 state;      // MS_*
	__u8 hflags;     // HF_*
	__u8 pos;        // length of the token being parsed (saturates at 255)
	__u8 _pad[3];
	__u32 walking;   // the request parser's only: 1 while a CPU walks the client's bytes (segment.h)
};

// A parser's scratch while one segment is parsed. It lives in the map
// value, not on the stack, because the verifier tracks constants on the
// stack through the parse loops and would check every combination of them;
// map values it treats as unknown.
struct scan {
	__u32 off, end; // bytes of the segment not yet parsed
	__u32 skip;     // bytes of the window already parsed
	__u32 used;     // bytes of the window parsed when bpf_loop stopped
	__u32 done;     // requests whose headers ended (rx) or responses completed (tx) in this segment
	__s32 err;      // 0, PARSE_ERROR or PARSE_LIMIT
};

// One server connection. Requests in flight are numbered: pushed counts the
// requests the request parser counted, popped those their responses (or the
// connection's end) completed. The oldest request in flight starts at
// oldest_ns; request i's start time and flags are in slot i % MAX_PIPELINE
// of the ring (its start time there only if it was not the oldest when
// counted), so pipelined requests are counted one by one and each response
// is framed by its own request (HEAD).
//
// Cache lines: the kernel puts a socket-storage value 8 bytes into a line.
// What both directions touch on every request shares the first (56 bytes);
// the request parser has the second, the response parser the third, each
// written by one side only; the ring's other slots the rest.
struct conn {
	__u64 tenure;      // the tenure of the pod's slot when accepted (see owner()); TENURE_NONE before
	__u64 oldest_ns;   // start time of the oldest request in flight
	__u32 slot;        // the pod's slot in pod_counters
	__u32 rx_next;     // next client sequence number not yet seen in order
	__u32 tx_next;     // next server sequence number not yet parsed
	__u32 pushed;      // requests counted (ingress; under the pod's lock)
	__u32 popped;      // requests completed (egress, close; under the pod's lock)
	__u16 head_bits;   // by ring slot: that request is HEAD (its response has no body)
	__u16 probe_bits;  // by ring slot: that request is a health probe (not load)
	__u8 proxied;      // the client is an activator
	__u8 seen;         // the client has sent bytes (so the server did not speak first)
	__u8 load;         // a request on it was load: later ones are too (see message.h)
	__u8 answered;     // a response ended: it is HTTP/1.x, and a parse failure loses the stream
	__u8 opaque;       // accounted at connection level (decided at its start)
	__u8 closed;       // the end of the connection was counted
	__u8 tunnel;       // upgraded (101) or a response until the end: no more requests
	__u8 rx_gap;       // client bytes beyond a hole were seen: [gap_seq, gap_end)
	__u32 rx_first;    // a stash entry's (lib/conn.h): the sequence number of its first byte
	__u8 adopted;      // open before the programs were loaded: ends at a FIN or RST too (lib/adopt.h)
	__u8 counted;      // count_accepted counted it (once, though adopt and sock_ops may both try)
	__u8 h2;           // H2_*: HTTP/2, its streams followed in its struct h2_conn (lib/h2.h)

	struct msg rx;     // the request parser
	struct scan rxs;
	__u32 gap_seq, gap_end; // client bytes seen ahead of rx_next, which TCP holds until the hole fills

	struct msg tx;     // the response parser
	struct scan txs;
	__u64 tx_last_ns;  // while the response parser is lost: when the server last sent bytes

	__u64 start_ns[MAX_PIPELINE]; // ring: start times of the later requests in flight
};

_Static_assert(__builtin_offsetof(struct conn, rx) == 56 && __builtin_offsetof(struct conn, tx) == 120 &&
		       __builtin_offsetof(struct conn, start_ns) == 184,
	       "the cache lines above");

// What a connection's h2 flag says (lib/h2.h).
enum {
	H2_NONE = 0,         // not HTTP/2 (or not yet known)
	H2_SERVER_FIRST = 1, // the server's first bytes were an HTTP/2 SETTINGS frame; the client's preface decides
	H2_FOLLOW = 2,       // HTTP/2 with prior knowledge: its frames and streams are followed
	H2_STASHED = 3,      // the client's preface reached the listening socket: followed from the accept on
	H2_UPGRADED = 4,     // HTTP/1.1 Upgrade: h2c (a 101, then the server's SETTINGS): the client's preface comes next
};

// One direction's HTTP/2 framing: where the next frame header starts, and
// the walk's scratch while one segment is walked (in the map value, not on
// the stack: see struct scan).
struct h2_dir {
	__u32 left;   // bytes of the current frame's payload not yet seen
	__u32 frames; // frames seen (the client's first after the preface must be SETTINGS)
	__u32 off;    // scratch: the segment's next byte to walk ...
	__u32 end;    // ... and its end
	__s32 err;    // scratch: 0, PARSE_ERROR or PARSE_LIMIT
	__u8 have;    // bytes of the next frame header seen so far, in hdr
	__u8 _pad[3];
	__u8 hdr[16]; // a frame header split over two segments (9 bytes; 16 for the index mask)
};

// An HTTP/2 connection's streams: each stream the client opened that is in
// flight, with its start time, in a slot of ids/start_ns (id 0: a free
// slot). Ingress fills a slot, and egress (or ingress, at a client's
// RST_STREAM) frees it with a compare-and-swap, which only one of them
// wins; the counts change under the pod's lock as for HTTP/1.x.
struct h2_conn {
	struct h2_dir rx;   // the client's frames
	struct h2_dir tx;   // the server's frames
	__u32 max_stream;   // the highest stream the client opened
	__u32 early_probes; // probes among the streams walked before the accept (count_accepted counts them)
	__u64 start_sum;    // the sum of the start times of the streams in flight (under the pod's lock)
	__u32 ids[MAX_H2_STREAMS];
	__u64 start_ns[MAX_H2_STREAMS];
};

// Counted events that indicate limits or bugs; exported as agent metrics.
enum event {
	EV_CONN_UNTRACKED = 0, // a connection was not tracked: no memory for its state
	EV_PARSE_LIMIT,       // a parser needed more than MAX_WINDOWS steps for a segment or
	                      // more than MAX_PIPELINE requests in flight: it lost the stream
	EV_PARSE_ERROR,       // a request or response was not valid HTTP/1.x
	EV_STREAM_GAP,        // client bytes the parser never saw (reordered away, or sent before
	                      // the accept and not kept) were not body bytes it could skip: it lost the stream
	EV_RESYNC,            // a parser that had lost the stream found it again
	EV_ADOPTED,           // a connection open before the programs were loaded was adopted (lib/adopt.h)
	EV_H2_FULL,           // an HTTP/2 stream was not counted: MAX_H2_STREAMS were in flight on its connection
	EV_H2_LOST,           // HTTP/2 frames could not be followed (a framing error, MAX_H2_FRAMES, a gap):
	                      // the connection fell back to connection level
	EV_RX_WAIT,           // a client segment waited for another CPU walking the same connection's bytes
	                      // (not a loss: the two are walked one after the other, lib/segment.h)
	EV_RX_TAKEOVER,       // a client segment waited MAX_RX_WAIT tries for another CPU's walk and walked all the
	                      // same (a claim nobody gives back; never seen on a working kernel)
	EV_MAX,
};

#endif
