//go:build !linux

package redistest

import "syscall"

// sysProcAttr has nothing to add outside Linux; cleanups kill the servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }
