//go:build !linux

package nodeaddr

import (
	"context"
	"errors"
)

// Run fails off Linux.
func Run(context.Context, Options) error { return errors.New("node addresses need Linux netlink") }
