// Package podwatch keeps the kernel's pod map equal to the running pods of
// this node and remembers who each pod address belongs to.
package podwatch
