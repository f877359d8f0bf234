//go:build unix

package main

import "syscall"

// raiseFileLimit raises the soft limit of open files to the hard limit and
// answers the soft limit in effect; an error leaves it as it was.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return uint64(lim.Cur), err
		}
		lim = raised
	}
	return uint64(lim.Cur), nil
}
