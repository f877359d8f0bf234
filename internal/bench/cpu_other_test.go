//go:build !unix

package bench

// processCPU is unknown here: the summary shows no process CPU.
func processCPU() int64 { return 0 }
