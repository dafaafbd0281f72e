// Package certfile serves a TLS key pair from files and loads it again when
// they change, so a renewed certificate needs no restart.
package certfile
