// Package redirect loads the connect-time redirect: in-kernel programs that
// send TCP connects to a Service address to one of its weighted backends,
// and gives the agent typed methods to program them.
package redirect
