package deploy

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// buildEnv and buildArgs build fenced as ../Dockerfile does (TestDockerfile
// checks that the Dockerfile says the same).
var (
	buildEnv  = []string{"CGO_ENABLED=0"}
	buildArgs = []string{"-trimpath", "-ldflags", "-s -w"}
)

// waitFor bounds every wait of these tests: a hang guard, not a timing
// assertion.
const waitFor = 60 * time.Second

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// fencedBinary builds ../cmd/fenced once per test run, the way the image
// does, and returns its path. The build runs in the parent module (this
// module cannot name a directory outside itself).
func fencedBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fenced-deploy-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "fenced")
		args := append(append([]string{"build"}, buildArgs...), "-o", buildPath, "./cmd/fenced")
		cmd := exec.Command("go", args...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), append([]string{"GOWORK=off"}, buildEnv...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%s go %q (in ..): %v\n%s", strings.Join(buildEnv, " "), args, err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildPath != "" {
		os.RemoveAll(filepath.Dir(buildPath))
	}
	os.Exit(code)
}

// TestStaticBinary: the image's build (CGO off) is statically linked: no
// program interpreter, no shared library needed, so it runs on distroless
// static (or scratch).
func TestStaticBinary(t *testing.T) {
	bin := fencedBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("elf.Open(%s): %v (the image's binary is a Linux ELF file)", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a PT_INTERP program header: dynamically linked, want static", bin)
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a PT_DYNAMIC program header: dynamically linked, want static", bin)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatalf("%s: ImportedLibraries: %v", bin, err)
	}
	if len(libs) != 0 {
		t.Errorf("%s needs shared libraries %q (DT_NEEDED), want none", bin, libs)
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s has a symbol table: -ldflags \"-s -w\" should strip it", bin)
	}
}

// flagInfo is one flag of `fenced serve --help`.
type flagInfo struct {
	name string   // without the dashes
	def  string   // the default shown, unquoted; a placeholder when it has none
	envs []string // its environment variables, in order
}

var (
	helpFlag = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?:=(\S*))?`)
	helpEnvs = regexp.MustCompile(`\((\$[A-Z0-9_]+(?:,\s*\$[A-Z0-9_]+)*)\)`)
)

// serveFlags runs `fenced serve --help` and parses its flags; a flag's help
// may wrap onto the lines after it.
func serveFlags(t *testing.T) map[string]flagInfo {
	t.Helper()
	out, err := exec.Command(fencedBinary(t), "serve", "--help").Output()
	if err != nil {
		t.Fatalf("fenced serve --help: %v", err)
	}
	var blocks []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case helpFlag.MatchString(line):
			blocks = append(blocks, line)
		case len(blocks) > 0 && strings.TrimSpace(line) != "":
			blocks[len(blocks)-1] += " " + strings.TrimSpace(line)
		}
	}
	flags := map[string]flagInfo{}
	for _, b := range blocks {
		m := helpFlag.FindStringSubmatch(b)
		fi := flagInfo{name: m[1], def: strings.Trim(m[2], `"`)}
		if e := helpEnvs.FindStringSubmatch(b); e != nil {
			for name := range strings.SplitSeq(e[1], ",") {
				fi.envs = append(fi.envs, strings.TrimPrefix(strings.TrimSpace(name), "$"))
			}
		}
		flags[fi.name] = fi
	}
	for _, want := range []string{"listen", "redis-url", "shutdown-timeout", "drain-delay"} {
		if _, ok := flags[want]; !ok {
			t.Fatalf("fenced serve --help: no --%s parsed from:\n%s", want, out)
		}
	}
	return flags
}

// envFlags maps each environment variable of flags to its flag.
func envFlags(flags map[string]flagInfo) map[string]flagInfo {
	m := map[string]flagInfo{}
	for _, f := range flags {
		for _, e := range f.envs {
			m[e] = f
		}
	}
	return m
}

// TestServeHelpParse pins the parser on flags whose help wraps.
func TestServeHelpParse(t *testing.T) {
	flags := serveFlags(t)
	if got := flags["redis-url"].envs; !slices.Equal(got, []string{"FENCED_REDIS_URL", "AGENTIHOOKS_SWARM_REDIS_URL"}) {
		t.Errorf("serveFlags()[redis-url].envs = %q, want [FENCED_REDIS_URL AGENTIHOOKS_SWARM_REDIS_URL]", got)
	}
	if got := flags["listen"]; got.def != ":7420" || !slices.Equal(got.envs, []string{"FENCED_LISTEN"}) {
		t.Errorf("serveFlags()[listen] = %+v, want default :7420, env FENCED_LISTEN", got)
	}
}

// portOf returns the port of a listen address such as ":7420".
func portOf(t *testing.T, what, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s = %q: %v", what, addr, err)
	}
	n, err := strconv.ParseInt(p, 10, 32)
	if err != nil {
		t.Fatalf("%s = %q: port %q: %v", what, addr, p, err)
	}
	return int32(n)
}

// servingAddr finds the gRPC address in fenced's log line "serving gRPC",
// text or JSON.
var servingAddr = regexp.MustCompile(`serving gRPC"?.*?\baddr"?[=:]"?([0-9.]+:[0-9]+)`)

// runFenced runs `fenced serve` with exactly env (and PATH) until the test
// ends, and returns its gRPC address once it logged it.
func runFenced(t *testing.T, env []string) string {
	t.Helper()
	addr, _ := startFenced(t, env)
	return addr
}

// startFenced is runFenced that also returns fenced's log, which goes on
// filling while it runs.
func startFenced(t *testing.T, env []string) (string, *syncBuffer) {
	t.Helper()
	log := &syncBuffer{}
	cmd := exec.Command(fencedBinary(t), "serve")
	cmd.Env = append(env, "PATH="+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start fenced: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("fenced log:\n%s", log.String())
		}
	})
	deadline := time.After(waitFor)
	for {
		if m := servingAddr.FindStringSubmatch(log.String()); m != nil {
			return m[1], log
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("fenced serve with %q exited before serving: %v\nlog:\n%s", env, err, log.String())
		case <-deadline:
			t.Fatalf("fenced serve with %q: no serving address logged after %v\nlog:\n%s", env, waitFor, log.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// healthStatus polls Health.Check(service) at addr until it answers
// SERVING or waitFor passes, and returns the last status or error.
func healthStatus(t *testing.T, addr, service string) string {
	return awaitHealthStatus(t, addr, service, healthpb.HealthCheckResponse_SERVING)
}

// awaitHealthStatus polls Health.Check(service) at addr until it answers
// want, NotFound, or waitFor passes, and returns the last status or error.
func awaitHealthStatus(t *testing.T, addr, service string, want healthpb.HealthCheckResponse_ServingStatus) string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(waitFor)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		last := resp.GetStatus().String()
		if err != nil {
			last = err.Error()
		}
		if resp.GetStatus() == want || time.Now().After(deadline) || strings.Contains(last, "NotFound") {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// dockerfile is ../Dockerfile, parsed just enough: its instructions, with
// continuation lines joined and comments dropped.
type dockerInstr struct {
	op   string // upper case
	args string
}

func readDockerfile(t *testing.T) []dockerInstr {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []dockerInstr
	cur := ""
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur == "") {
			continue
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur += s + " "
			continue
		}
		cur += line
		op, args, _ := strings.Cut(strings.TrimSpace(cur), " ")
		out = append(out, dockerInstr{strings.ToUpper(op), strings.TrimSpace(args)})
		cur = ""
	}
	return out
}

// TestDockerfile: the Dockerfile builds the way fencedBinary does (static,
// CGO off), with the Go of go.mod, onto a non-root distroless base, and
// runs `fenced serve`.
func TestDockerfile(t *testing.T) {
	instrs := readDockerfile(t)
	var froms, runs, exposes, users, entrypoints []string
	for _, in := range instrs {
		switch in.op {
		case "FROM":
			froms = append(froms, in.args)
		case "RUN":
			runs = append(runs, in.args)
		case "EXPOSE":
			exposes = append(exposes, strings.Fields(in.args)...)
		case "USER":
			users = append(users, in.args)
		case "ENTRYPOINT":
			entrypoints = append(entrypoints, in.args)
		}
	}
	if len(froms) < 2 {
		t.Fatalf("Dockerfile FROM = %q, want a multi-stage build", froms)
	}
	goMod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goMod)
	if goVersion == nil {
		t.Fatalf("../go.mod has no go line")
	}
	if want := "golang:" + string(goVersion[1]) + " AS build"; !strings.HasSuffix(froms[0], want) {
		t.Errorf("Dockerfile first FROM = %q, want the builder %q (go.mod says go %s)", froms[0], want, goVersion[1])
	}
	if final := froms[len(froms)-1]; final != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("Dockerfile final FROM = %q, want gcr.io/distroless/static-debian12:nonroot", final)
	}
	build := ""
	for _, r := range runs {
		if strings.Contains(r, "go build") {
			build = r
		}
	}
	for _, want := range append(append([]string{"go build"}, buildEnv...), "-trimpath", `-ldflags "-s -w"`, "./cmd/fenced") {
		if !strings.Contains(build, want) {
			t.Errorf("Dockerfile go build step %q lacks %q", build, want)
		}
	}
	if !slices.Equal(users, []string{"65532:65532"}) {
		t.Errorf("Dockerfile USER = %q, want [65532:65532] (distroless nonroot)", users)
	}
	var entry []string
	if len(entrypoints) == 1 {
		if err := json.Unmarshal([]byte(entrypoints[0]), &entry); err != nil {
			t.Errorf("Dockerfile ENTRYPOINT %s: not exec form: %v", entrypoints[0], err)
		}
	}
	if !slices.Equal(entry, []string{"/fenced", "serve"}) {
		t.Errorf("Dockerfile ENTRYPOINT = %q, want [\"/fenced\", \"serve\"]", entrypoints)
	}
	if len(exposes) == 0 {
		t.Errorf("Dockerfile exposes no port (TestDockerfileMatchesManifests compares them)")
	}
}
