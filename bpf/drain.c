// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Program sockscale_drain: what the server of a leaving pod writes on a
// connection the agent put in the draining map. Included by accounting.c,
// not compiled on its own.
//
// Hook: sk_msg verdict of the draining sockhash (BPF_SK_MSG_VERDICT): it
// runs on the sendmsg calls of those sockets only, so it costs the pods
// that are not leaving nothing.
// Does: once per connection, if the first write after the connection
// entered the map starts an HTTP/1.x response ("HTTP/1.1 200 ...\r\n"),
// it adds "Connection: close" after the status line, as a sidecar proxy
// does for a pod it drains: the client reads that one response and closes
// the connection, and its next request opens a connection elsewhere
// instead of going to a pod that is about to stop. The agent puts a
// connection in the map only between two responses (nothing in flight to
// the client, the response parser at a message start), so the first write
// that follows begins one; a write that does not look like one is let
// through and the connection is left alone.
// Minimum kernel: 5.17 for the accounting as a whole; sk_msg with
// bpf_msg_push_data and socket storage from 5.10.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "accounting.h"
#include "lib/conn.h"
#include "lib/maps.h"

#define CLOSE_HEADER "Connection: close\r\n"
#define CLOSE_HEADER_LEN (sizeof(CLOSE_HEADER) - 1)
#define STATUS_LINE_MAX 64 // where the status line's CRLF is looked for

// Whether sockscale_drain has had its one look at a connection.
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC); // required for socket storage
	__type(key, int);
	__type(value, __u8); // 1 once looked at
} drain_seen SEC(".maps");

// status_line_end returns the offset just past the CRLF of the status line
// that starts data[0, n), or 0 if those bytes do not start one: "HTTP/1.",
// '0' or '1', a space and three digits.
static __always_inline __u32 status_line_end(const char *data, const char *end)
{
	__u32 i;

	// The verifier needs the window inside the packet data.
	if ((const void *)(data + STATUS_LINE_MAX) > (const void *)end)
		return 0;
	if (data[0] != 'H' || data[1] != 'T' || data[2] != 'T' || data[3] != 'P' || data[4] != '/' ||
	    data[5] != '1' || data[6] != '.' || (data[7] != '0' && data[7] != '1') || data[8] != ' ')
		return 0;
	for (i = 9; i < 12; i++)
		if (data[i] < '0' || data[i] > '9')
			return 0;
	for (i = 12; i < STATUS_LINE_MAX - 1; i++)
		if (data[i] == '\r' && data[i + 1] == '\n')
			return i + 2;
	return 0;
}

// Always lets the bytes through (SK_PASS); at most adds the header.
SEC("sk_msg")
int sockscale_drain(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	char *data, *end;
	struct conn *c;
	__u8 *seen;
	__u32 at, i;

	if (!sk)
		return SK_PASS; // the verifier's rule: sk may be NULL
	seen = bpf_sk_storage_get(&drain_seen, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!seen || *seen)
		return SK_PASS;
	*seen = 1;
	c = bpf_sk_storage_get(&conn_store, sk, 0, 0);
	if (c && (c->opaque || c->tunnel || c->h2))
		return SK_PASS; // not HTTP/1.x, or upgraded
	if (msg->size < STATUS_LINE_MAX || bpf_msg_pull_data(msg, 0, STATUS_LINE_MAX, 0))
		return SK_PASS; // a short write: no room to look for the status line
	at = status_line_end(msg->data, msg->data_end);
	if (!at)
		return SK_PASS;
	if (bpf_msg_push_data(msg, at, CLOSE_HEADER_LEN, 0))
		return SK_PASS;
	// The pushed bytes are not initialised: they are written below or
	// taken out again. The write grew by them, so the pull fits.
	if (bpf_msg_pull_data(msg, 0, STATUS_LINE_MAX + CLOSE_HEADER_LEN, 0))
		goto undo;
	data = msg->data;
	end = msg->data_end;
	// The verifier needs the header's bytes inside the pulled data.
	if (at > STATUS_LINE_MAX || (void *)(data + at + CLOSE_HEADER_LEN) > (void *)end)
		goto undo;
#pragma clang loop unroll(full)
	for (i = 0; i < CLOSE_HEADER_LEN; i++)
		data[at + i] = CLOSE_HEADER[i];
	return SK_PASS;
undo:
	bpf_msg_pop_data(msg, at, CLOSE_HEADER_LEN, 0);
	return SK_PASS;
}
