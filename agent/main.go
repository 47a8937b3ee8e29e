// rf-agent: the program a warm check pod (or container) runs beside its resource's scripts
// (docs/warm-checks.md). It runs /opt/resource/check for many sources of one team and one
// image, each in a directory of its own, and nothing else.
//
//	rf-agent serve --listen :7777 --token-file F --root /rf/sources [--max-checks 8] [--idle-seconds 300]
//	rf-agent run --root /tmp/rf-sources --source NAME [--idle-seconds 300]
//	rf-agent kill --root /tmp/rf-sources --source NAME
//
// (--script names another program than /opt/resource/check, for tests.)
//
// serve (a warm pod, under catatonit): POST /check with "Authorization: Bearer <the pod's
// token>", the source's directory name in X-RF-Source (hex), the check's budget in
// X-RF-Timeout (seconds) and the request as the body, which goes to the check's stdin. The
// answer streams frames (type byte, 4-byte big-endian length, payload): 'o' stdout, 'e'
// stderr, then 'x' with the exit code (int32; -1 for a signal) or 't' when the budget ran out
// (the check's process group killed). 401 without the token, 400 for a bad header, 409
// while the source's previous check runs, 429 when --max-checks run. GET /healthz: 200.
//
// run (a warm container on a local engine, one exec per check): the same directories and
// environment, the check's stdio the exec's, its exit code the exec's (137 when killed);
// kill (another exec) ends the check of a source under way, with every process it started:
// what the function does at the end of the check's budget, or when its sender stops it.
//
// Each source's directory holds home/ and tmp/ (created 0700 on its first check): the check
// runs there with HOME and TMPDIR pointing at them, the image's other environment kept, in
// a process group of its own (killed with all it started when the check ends or runs over).
// A directory unused for --idle-seconds is removed.
package main

import (
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const maxRequest = 4 << 20 // a check's request: the functions send at most 2 MiB

// script: what a check runs (a flag, for tests; the request never names it).
var script = "/opt/resource/check"

var sourceName = regexp.MustCompile(`^[0-9a-f]{16,64}$`)

func main() {
	if len(os.Args) < 2 {
		fail("usage: rf-agent serve|run [flags]")
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "run":
		runOne(os.Args[2:])
	case "kill":
		killOne(os.Args[2:])
	default:
		fail("rf-agent: unknown command " + strconv.Quote(os.Args[1]))
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, message)
	os.Exit(2)
}

// --- the sources' directories ------------------------------------------------------------

// sources: the directories under root, which one is busy, and when each was last used.
type sources struct {
	root string
	mu   sync.Mutex
	busy map[string]bool
	used map[string]time.Time
}

func newSources(root string) *sources {
	return &sources{root: root, busy: map[string]bool{}, used: map[string]time.Time{}}
}

// take marks name busy; false if its previous check still runs.
func (s *sources) take(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[name] {
		return false
	}
	s.busy[name] = true
	return true
}

func (s *sources) give(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.busy, name)
	s.used[name] = time.Now()
}

// expire removes the directories unused for idle.
func (s *sources) expire(idle time.Duration) {
	s.mu.Lock()
	var gone []string
	for name, at := range s.used {
		if !s.busy[name] && time.Since(at) >= idle {
			gone = append(gone, name)
			delete(s.used, name)
			s.busy[name] = true // nobody takes it while it goes
		}
	}
	s.mu.Unlock()
	for _, name := range gone {
		os.RemoveAll(filepath.Join(s.root, name))
		s.mu.Lock()
		delete(s.busy, name)
		s.mu.Unlock()
	}
}

// command: the check of source name, in its directory, with its HOME and TMPDIR.
func command(root, name string) (*exec.Cmd, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, name)
	for _, sub := range []string{"home", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(script)
	cmd.Dir = dir
	cmd.Env = environment(filepath.Join(dir, "home"), filepath.Join(dir, "tmp"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

func environment(home, tmp string) []string {
	var env []string
	for _, pair := range os.Environ() {
		if !strings.HasPrefix(pair, "HOME=") && !strings.HasPrefix(pair, "TMPDIR=") {
			env = append(env, pair)
		}
	}
	return append(env, "HOME="+home, "TMPDIR="+tmp)
}

// killGroup ends every process the check started (its process group).
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// --- serve -------------------------------------------------------------------------------

type server struct {
	token   []byte
	sources *sources
	slots   chan struct{}
}

func serve(args []string) {
	flags := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := flags.String("listen", ":7777", "address to listen on")
	tokenFile := flags.String("token-file", "", "file holding the pod's token")
	root := flags.String("root", "/rf/sources", "where the sources' directories go")
	maxChecks := flags.Int("max-checks", 8, "checks at once")
	idle := flags.Float64("idle-seconds", 300, "a source's directory unused this long goes")
	flags.StringVar(&script, "script", script, "the check script")
	flags.Parse(args)
	token, err := os.ReadFile(*tokenFile)
	if err != nil || len(strings.TrimSpace(string(token))) < 16 {
		fail(fmt.Sprintf("rf-agent: no token of 16 characters or more in %q: %v", *tokenFile, err))
	}
	if err := os.MkdirAll(*root, 0o700); err != nil {
		fail(fmt.Sprintf("rf-agent: cannot make %s: %v", *root, err))
	}
	s := &server{
		token:   []byte(strings.TrimSpace(string(token))),
		sources: newSources(*root),
		slots:   make(chan struct{}, *maxChecks),
	}
	go func() {
		for range time.Tick(30 * time.Second) {
			s.sources.expire(time.Duration(*idle * float64(time.Second)))
		}
	}()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })
	mux.HandleFunc("/check", s.check)
	server := &http.Server{
		Addr:              *listen,
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	fail(fmt.Sprintf("rf-agent: %v", server.ListenAndServe()))
}

func (s *server) check(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	given := []byte(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	if subtle.ConstantTimeCompare(given, s.token) != 1 {
		http.Error(w, "no valid token for this pod", http.StatusUnauthorized)
		return
	}
	name := r.Header.Get("X-RF-Source")
	budget, err := strconv.ParseFloat(r.Header.Get("X-RF-Timeout"), 64)
	if !sourceName.MatchString(name) || err != nil || budget <= 0 || budget > 86400 {
		http.Error(w, "X-RF-Source (hex) and X-RF-Timeout (seconds) are needed", http.StatusBadRequest)
		return
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		http.Error(w, "this pod runs as many checks as it takes", http.StatusTooManyRequests)
		return
	}
	if !s.sources.take(name) {
		http.Error(w, "this source's previous check still runs", http.StatusConflict)
		return
	}
	defer s.sources.give(name)
	s.run(w, r, name, time.Duration(budget*float64(time.Second)))
}

// frames: what the answer streams, one writer at a time, flushed as it comes.
type frames struct {
	mu sync.Mutex
	w  http.ResponseWriter
}

func (f *frames) write(kind byte, payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	head := make([]byte, 5)
	head[0] = kind
	binary.BigEndian.PutUint32(head[1:], uint32(len(payload)))
	if _, err := f.w.Write(append(head, payload...)); err != nil {
		return err
	}
	if flusher, ok := f.w.(http.Flusher); ok {
		flusher.Flush()
	}
	return nil
}

// stream copies one of the check's outputs into frames of kind; a client gone ends the check.
func stream(out *frames, kind byte, from io.Reader, gone func()) {
	buffer := make([]byte, 32<<10)
	for {
		n, err := from.Read(buffer)
		if n > 0 && out.write(kind, buffer[:n]) != nil {
			gone()
		}
		if err != nil {
			return
		}
	}
}

func (s *server) run(w http.ResponseWriter, r *http.Request, name string, budget time.Duration) {
	cmd, err := command(s.sources.root, name)
	if err != nil {
		http.Error(w, "cannot make the source's directory: "+err.Error(), http.StatusInternalServerError)
		return
	}
	request, err := io.ReadAll(io.LimitReader(r.Body, maxRequest+1))
	if err != nil || len(request) > maxRequest {
		http.Error(w, "the request must arrive whole, at most 4 MiB", http.StatusBadRequest)
		return
	}
	cmd.Stdin = bytes.NewReader(request)
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		http.Error(w, "cannot start the check: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-rf-frames")
	w.WriteHeader(http.StatusOK)
	out := &frames{w: w}
	var once sync.Once
	var timedOut atomic.Bool
	end := func() { once.Do(func() { killGroup(cmd) }) }
	timer := time.AfterFunc(budget, func() { timedOut.Store(true); end() })
	go func() { <-r.Context().Done(); end() }() // the function gave up on it
	var streams sync.WaitGroup
	streams.Add(2)
	go func() { defer streams.Done(); stream(out, 'o', stdout, end) }()
	go func() { defer streams.Done(); stream(out, 'e', stderr, end) }()
	streams.Wait()
	waited := cmd.Wait()
	timer.Stop()
	killGroup(cmd) // what it left running in its group goes with it
	if timedOut.Load() {
		out.write('t', nil)
		return
	}
	code := int32(0)
	var exited *exec.ExitError
	if errors.As(waited, &exited) {
		code = int32(exited.ExitCode())
	} else if waited != nil {
		code = -1
	}
	payload := make([]byte, 4)
	binary.BigEndian.PutUint32(payload, uint32(code))
	out.write('x', payload)
}

// --- run and kill (a local engine's execs) ------------------------------------------------

// runOne runs one check of --source, as serve would, with the exec's stdio: under an
// exclusive lock of the source's directory (a second check of it waits), its process group
// written to .pgid (for kill), and first removing the sources unused for --idle-seconds.
func runOne(args []string) {
	flags := flag.NewFlagSet("run", flag.ExitOnError)
	root := flags.String("root", "/tmp/rf-sources", "where the sources' directories go")
	name := flags.String("source", "", "the source's directory name (hex)")
	idle := flags.Float64("idle-seconds", 300, "a source's directory unused this long goes")
	flags.StringVar(&script, "script", script, "the check script")
	flags.Parse(args)
	if !sourceName.MatchString(*name) {
		fail("rf-agent run: --source must be 16 to 64 hex digits")
	}
	if err := os.MkdirAll(*root, 0o700); err != nil {
		fail("rf-agent run: cannot make " + *root + ": " + err.Error())
	}
	sweepIdle(*root, *name, time.Duration(*idle*float64(time.Second)))
	lock, err := lockSource(*root, *name, true)
	if err != nil {
		fail("rf-agent run: cannot lock the source's directory: " + err.Error())
	}
	defer lock.Close()
	cmd, err := command(*root, *name)
	if err != nil {
		fail("rf-agent run: cannot make the source's directory: " + err.Error())
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fail("rf-agent run: cannot start the check: " + err.Error())
	}
	pgid := filepath.Join(*root, *name, ".pgid")
	os.WriteFile(pgid, []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	waited := cmd.Wait()
	killGroup(cmd)
	os.Remove(pgid)
	os.Chtimes(filepath.Join(*root, *name), time.Now(), time.Now())
	var exited *exec.ExitError
	if errors.As(waited, &exited) {
		code := exited.ExitCode()
		if code < 0 {
			code = 137 // killed by a signal (kill, the budget)
		}
		os.Exit(code)
	}
	if waited != nil {
		os.Exit(1)
	}
}

// killOne ends the check of --source under way, with every process it started.
func killOne(args []string) {
	flags := flag.NewFlagSet("kill", flag.ExitOnError)
	root := flags.String("root", "/tmp/rf-sources", "where the sources' directories go")
	name := flags.String("source", "", "the source's directory name (hex)")
	flags.Parse(args)
	if !sourceName.MatchString(*name) {
		fail("rf-agent kill: --source must be 16 to 64 hex digits")
	}
	text, err := os.ReadFile(filepath.Join(*root, *name, ".pgid"))
	if err != nil {
		return // no check under way
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(text))); err == nil && pid > 1 {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// lockSource: the source's lock file (beside its directory), held exclusively while a check
// runs; wait: block until free, else fail at once when taken.
func lockSource(root, name string, wait bool) (*os.File, error) {
	file, err := os.OpenFile(filepath.Join(root, name+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if !wait {
		how |= syscall.LOCK_NB
	}
	if err := syscall.Flock(int(file.Fd()), how); err != nil {
		file.Close()
		return nil, err
	}
	return file, nil
}

// sweepIdle removes the directories (but keep's) unused for idle and not locked by a check.
func sweepIdle(root, keep string, idle time.Duration) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, entry := range entries {
		name := entry.Name()
		if !entry.IsDir() || name == keep || !sourceName.MatchString(name) {
			continue
		}
		info, err := entry.Info()
		if err != nil || time.Since(info.ModTime()) < idle {
			continue
		}
		if lock, err := lockSource(root, name, false); err == nil {
			os.RemoveAll(filepath.Join(root, name))
			os.Remove(filepath.Join(root, name+".lock"))
			lock.Close()
		}
	}
}
