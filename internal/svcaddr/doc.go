// Package svcaddr says which addresses of a public Service the kernel's
// connect-time redirect matches in Proxy mode. The agent writes them into
// its node's map; the controller uses the same answer to say on the
// ServerlessService whether the socket layer can switch the target at all.
package svcaddr
