// Package namedns creates, lists and deletes named network namespaces as
// `ip netns add/list/delete` do: bind mounts under /run/netns (iproute2's
// /var/run/netns), so `ip netns exec` and code that opens /run/netns/NAME
// find them.
package namedns
