// Package stats is the wire format and transport of request statistics
// from node agents (per pod) and activators (per target) to the
// controller.
//
// # Transport
//
// Every report period (1 s by default) each agent POSTs one batch to
// /v1/stats on every controller replica: it resolves the controller's
// headless Service to all its addresses, so the standby replica keeps the
// same windows as the leader and takes over warm. Connections are kept
// alive, so a cluster of N nodes holds N connections per replica. A batch
// that fails is dropped, not retried: the next period brings fresh data,
// and a second a pod did not report is completed from the pods heard (or
// held) by the controller's collector, never read as zero load. The
// controller places each report on its own clock where it arrives, over
// the Period before it; Start is informational. The receiving handler is the
// controller's (controller/internal/statsserver); this package holds only
// what both sides must agree on.
//
// Each POST carries "Authorization: Bearer <token>", the sender's projected
// ServiceAccount token for the controller's audience, read from its file
// for every batch (the kubelet rotates it). The controller answers 401
// (no or bad token), 403 (not an agent or activator, or a batch that is
// not the sender's to send) or 503 (it cannot check the token now); see
// controller/internal/statsauth for why tokens and not client
// certificates.
// With a CA file the senders post over HTTPS to each resolved replica
// address, verifying the Service's name in its certificate, so the tokens
// never cross the pod network in clear.
//
// An agent also sends its node's state in the HeaderNodeState header of
// each POST (see NodeState): whether the connect-time redirect is in effect
// there. The controller turns the states into the SocketLayer condition of
// every ServerlessService. Activators send no such header.
//
// # Encoding
//
// A batch is little-endian binary, version 1 to 4 ("uvarint" and
// "varint" are encoding/binary's):
//
//	magic     4 bytes  "SSST"
//	version   1 byte   1: pod records only; 2: pod records, then target records;
//	                   3: pod records with their accounting, then target records;
//	                   4: as 3, with 16-byte pod addresses
//	node      uvarint length, then UTF-8 bytes (an agent's node, an activator's pod)
//	start     varint   period start, Unix nanoseconds
//	duration  uvarint  period length in nanoseconds (> 0)
//	count     uvarint  number of pod records
//	records   count times:
//	  ip                versions 1 to 3: 4 bytes, pod IPv4; version 4: 16 bytes, pod
//	                    IPv6, or IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d), read as IPv4
//	  namespace, pod    uvarint length, then bytes, each
//	  workload          uvarint length, then bytes (e.g. the Deployment's name)
//	  concurrency       8 bytes  float64: average requests in flight
//	  proxied           8 bytes  float64: average of those that came through an activator
//	  requests          uvarint  requests completed in the period
//	  proxiedRequests   uvarint  of those, through an activator
//	  accounting        versions 3 and 4: 1 byte, 0: HTTP/1 requests, 1: HTTP/2 streams,
//	                    2: connections (some counted at connection level)
//	  opaque            versions 3 and 4: 8 bytes float64, the part of concurrency from
//	                    connection-level connections (0 unless accounting is 2)
//	targets   versions 2 to 4: uvarint count (at least 1 in version 2), then count times:
//	  namespace, workload  uvarint length, then bytes, each (workload as above)
//	  concurrency          8 bytes  float64: average requests held or forwarded by this activator
//	  requests             uvarint  requests that arrived at it in the period
//
// A pod is known by one address (package podaddr): its IPv4 address if
// it has one, else its first IPv6 one.
//
// Encoders write the lowest version that holds a batch: version 4 only
// when some pod's address is IPv6 (an IPv6-only pod), else version 3 only
// when some pod's accounting is not the default (HTTP/1 requests, no
// opaque concurrency), else version 1 without target records and 2 with.
// Decode refuses a batch in a higher version than it needs, so each batch
// has one encoding. So an agent's batches stay readable by a controller
// that predates a version while a rolling upgrade is under way: a
// reporter answered 400 for a version 4 batch (such a controller) sends
// that replica its batches without the IPv6 pods' records for a while,
// and for a version 3 batch without the accounting too (report.Reporter).
// Activators report every
// period and, for a target with no pod, at once on its first request (a
// batch whose period ends at that moment), so the controller decides
// without waiting for the next tick (activator/internal/stats says what
// that costs in accuracy).
//
// A record takes about 50 bytes plus its names: 100 pods are ~7 KB, so
// 5,000 nodes send ~35 MB/s to each replica, which decodes at well over
// that rate on one core (see BenchmarkDecode).
package stats
