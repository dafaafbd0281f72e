// Package service reconciles serving Services: each template makes an
// immutable Revision, and the status names the latest created and ready
// Revisions and the traffic split resolved to Revision names.
package service
