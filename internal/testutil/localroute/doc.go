// Package localroute asks the kernel which route a packet to an address
// would take (a netlink route lookup, as `ip route get`), so tests and
// benchmarks send nothing to an address whose traffic would leave the
// machine.
package localroute
