package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// errAddrInUse marks a start that failed because the port was taken.
var errAddrInUse = errors.New("address already in use")

// process is one running redis-server child process.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
	err  error         // cmd.Wait result, valid after done is closed
}

// launch starts redis-server with s.args and waits until it answers PING.
// On failure the process is gone and the error wraps errAddrInUse when the
// log says the port was taken. Callers hold no lock; launch takes s.mu only
// to publish the process.
func (s *Server) launch() error {
	stdio, err := os.OpenFile(filepath.Join(s.dir, "stdio.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer stdio.Close() // the child keeps its own copy of the descriptor
	before := s.logSizes()

	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	cmd.Stdout = stdio
	cmd.Stderr = stdio
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	s.mu.Lock()
	s.proc = p
	addr := s.addr
	s.mu.Unlock()

	if err := waitReady(addr, p.done); err != nil {
		s.mu.Lock()
		p.kill()
		if s.proc == p {
			s.proc = nil
		}
		s.mu.Unlock()
		if errors.Is(err, errExited) {
			err = fmt.Errorf("%w (%v)", err, p.err)
		}
		if strings.Contains(s.logSince(before), "Address already in use") {
			return fmt.Errorf("%w: %v", errAddrInUse, err)
		}
		return err
	}
	return nil
}

// logNames are the files in the data dir a local server writes to.
var logNames = []string{"stdio.log", "redis.log"}

// logSizes records the current size of each log file.
func (s *Server) logSizes() map[string]int64 {
	m := make(map[string]int64, len(logNames))
	for _, n := range logNames {
		if fi, err := os.Stat(filepath.Join(s.dir, n)); err == nil {
			m[n] = fi.Size()
		}
	}
	return m
}

// logSince returns what the log files gained after sizes were recorded, so
// a retry does not react to an earlier attempt's messages.
func (s *Server) logSince(sizes map[string]int64) string {
	var b strings.Builder
	for _, n := range logNames {
		data, err := os.ReadFile(filepath.Join(s.dir, n))
		if err != nil {
			continue
		}
		if off := sizes[n]; off <= int64(len(data)) {
			b.Write(data[off:])
		}
	}
	return b.String()
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// kill sends SIGKILL to this process (by pid, only the child we started)
// and waits until it has exited.
func (p *process) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}
