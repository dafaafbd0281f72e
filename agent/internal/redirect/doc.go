// Package redirect keeps this node's connect-time redirect map equal to the
// ServerlessServices in Proxy mode (their public Service's address to their
// activators) and the Routes' splits (a Route's address to its revisions'
// public Services by percent), for new connects only.
package redirect
