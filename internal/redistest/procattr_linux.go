package redistest

import "syscall"

// sysProcAttr makes the kernel SIGKILL redis-server if the test binary dies
// without running its cleanups (for example on a go test -timeout panic),
// so no servers are left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
