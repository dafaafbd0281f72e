// Package redirect keeps this node's connect-time redirect map equal to the
// ServerlessServices in Proxy mode: their public Service's address to their
// activators, for new connects only.
package redirect
