// rf-agent: the program a warm check pod (or container) runs beside its resource's scripts
// (docs/warm-checks.md). It runs /opt/resource/check for many sources of one team and one
// image, each in a directory of its own, and nothing else.
//
//	rf-agent serve --listen :7777 --token-file F --root /rf/sources [--max-checks 8] [--idle-seconds 300]
//	rf-agent run --root /tmp/rf-sources --source NAME [--timeout SECONDS] [--idle-seconds 300]
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
// environment, the check's output the exec's, its exit code the exec's (137 when killed,
// by its --timeout or by kill); kill (another exec) ends the check of a source under way,
// with every process it started: what the function does when its sender stops it.
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
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	maxRequest = 4 << 20         // a check's request: the functions send at most 2 MiB
	drainTime  = 2 * time.Second // output read after a check exited, at most
)

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

// expire removes the directories unused for idle: each is renamed away under the lock (a
// check that comes meanwhile makes a fresh one) and deleted after.
func (s *sources) expire(idle time.Duration) {
	s.mu.Lock()
	var gone []string
	for name, at := range s.used {
		if !s.busy[name] && time.Since(at) >= idle {
			trash := filepath.Join(s.root, fmt.Sprintf(".gone-%s-%d", name, time.Now().UnixNano()))
			if os.Rename(filepath.Join(s.root, name), trash) == nil {
				gone = append(gone, trash)
			}
			delete(s.used, name)
		}
	}
	s.mu.Unlock()
	for _, trash := range gone {
		os.RemoveAll(trash)
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

// seconds as a Duration (the flags' and the request's figures).
func seconds(figure float64) time.Duration {
	return time.Duration(figure * float64(time.Second))
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
	go func(idle time.Duration) {
		for range time.Tick(30 * time.Second) {
			s.sources.expire(idle)
		}
	}(seconds(*idle))
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
	auth := r.Header.Get("Authorization")
	given := []byte(strings.TrimPrefix(auth, "Bearer "))
	if !strings.HasPrefix(auth, "Bearer ") || subtle.ConstantTimeCompare(given, s.token) != 1 {
		http.Error(w, "no valid token for this pod", http.StatusUnauthorized)
		return
	}
	name := r.Header.Get("X-RF-Source")
	budget, err := strconv.ParseFloat(r.Header.Get("X-RF-Timeout"), 64)
	if !sourceName.MatchString(name) || err != nil || math.IsNaN(budget) || budget <= 0 || budget > 86400 {
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
	s.run(w, r, name, seconds(budget))
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
	out := &frames{w: w}
	begin := func() {
		w.Header().Set("Content-Type", "application/x-rf-frames")
		w.WriteHeader(http.StatusOK)
	}
	code, timedOut, err := supervise(cmd, bytes.NewReader(request), budget, r.Context().Done(), begin,
		func(data []byte) error { return out.write('o', data) },
		func(data []byte) error { return out.write('e', data) })
	if err != nil { // it did not start: supervise errs only then
		http.Error(w, "cannot start the check: "+err.Error(), http.StatusInternalServerError)
		return
	}
	if timedOut {
		out.write('t', nil)
		return
	}
	payload := make([]byte, 4)
	binary.BigEndian.PutUint32(payload, uint32(int32(code)))
	out.write('x', payload)
}

// supervise runs cmd (begin is called once it started) with stdin, handing what it writes
// to stdout and stderr on as it comes (a write that fails, the client gone, ends it). The
// check's process group is killed when stop is closed, when budget passes (0: none), and
// once the check has exited (what it left running goes with it); its output is then read
// for drainTime at most (a child that left the group does not hold the check by keeping
// the pipes open). The exit code (-1 for a signal), and whether the budget killed it.
func supervise(cmd *exec.Cmd, stdin io.Reader, budget time.Duration, stop <-chan struct{},
	begin func(), stdout, stderr func([]byte) error) (int, bool, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return -1, false, err
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return -1, false, err
	}
	defer errR.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		return -1, false, err
	}
	begin()
	var mu sync.Mutex
	exited, budgetRanOut := false, false
	end := func(byBudget bool) {
		mu.Lock()
		defer mu.Unlock()
		if !exited {
			budgetRanOut = budgetRanOut || byBudget
			killGroup(cmd)
		}
	}
	if budget > 0 {
		timer := time.AfterFunc(budget, func() { end(true) })
		defer timer.Stop()
	}
	waitedFor := make(chan struct{})
	go func() {
		select {
		case <-stop:
			end(false)
		case <-waitedFor:
		}
	}()
	var streams sync.WaitGroup
	streams.Add(2)
	go copyOut(&streams, outR, stdout, func() { end(false) })
	go copyOut(&streams, errR, stderr, func() { end(false) })
	waited := cmd.Wait()
	mu.Lock()
	exited = true
	mu.Unlock()
	close(waitedFor)
	killGroup(cmd) // what it left running in its group
	drained := make(chan struct{})
	go func() { streams.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTime):
		outR.Close() // unblocks the readers (the deferred closes then do nothing)
		errR.Close()
		<-drained
	}
	var status *exec.ExitError
	if errors.As(waited, &status) {
		if status.ExitCode() < 0 {
			return -1, budgetRanOut, nil // killed: by its budget, or its sender's stop
		}
		return status.ExitCode(), false, nil
	}
	if waited != nil {
		return -1, false, nil
	}
	return 0, false, nil
}

// copyOut hands what from gives to to, until its end; a failed hand-over calls gone once
// and the rest is read and dropped (so the check never blocks on a full pipe).
func copyOut(done *sync.WaitGroup, from io.Reader, to func([]byte) error, gone func()) {
	defer done.Done()
	buffer := make([]byte, 32<<10)
	failed := false
	for {
		n, err := from.Read(buffer)
		if n > 0 && !failed && to(buffer[:n]) != nil {
			failed = true
			gone()
		}
		if err != nil {
			return
		}
	}
}

// --- run and kill (a local engine's execs) ------------------------------------------------

// runOne runs one check of --source, as serve would, with the exec's stdio: under an
// exclusive lock of the source (waited for up to --timeout), its process group written to
// <root>/<source>.pgid (for kill), ended with every process it started when --timeout
// passes (exit 137, and a line on stderr); first removing the sources unused for
// --idle-seconds.
func runOne(args []string) {
	flags := flag.NewFlagSet("run", flag.ExitOnError)
	root := flags.String("root", "/tmp/rf-sources", "where the sources' directories go")
	name := flags.String("source", "", "the source's directory name (hex)")
	idle := flags.Float64("idle-seconds", 300, "a source's directory unused this long goes")
	timeout := flags.Float64("timeout", 0, "seconds before the check is killed (0: none)")
	flags.StringVar(&script, "script", script, "the check script")
	flags.Parse(args)
	if !sourceName.MatchString(*name) {
		fail("rf-agent run: --source must be 16 to 64 hex digits")
	}
	if err := os.MkdirAll(*root, 0o700); err != nil {
		fail("rf-agent run: cannot make " + *root + ": " + err.Error())
	}
	budget := seconds(*timeout)
	sweepIdle(*root, *name, seconds(*idle))
	lock, err := lockSource(*root, *name, budget)
	if err != nil {
		fail("rf-agent run: the source's previous check still runs: " + err.Error())
	}
	defer lock.Close()
	cmd, err := command(*root, *name)
	if err != nil {
		fail("rf-agent run: cannot make the source's directory: " + err.Error())
	}
	pgid := filepath.Join(*root, *name+".pgid")
	begin := func() { writeAtomically(pgid, strconv.Itoa(cmd.Process.Pid)) }
	write := func(to *os.File) func([]byte) error {
		return func(data []byte) error { _, err := to.Write(data); return err }
	}
	code, timedOut, err := supervise(cmd, os.Stdin, budget, nil, begin, write(os.Stdout), write(os.Stderr))
	os.Remove(pgid)
	os.Chtimes(filepath.Join(*root, *name), time.Now(), time.Now())
	switch {
	case err != nil:
		fail("rf-agent run: cannot start the check: " + err.Error())
	case timedOut:
		fmt.Fprintf(os.Stderr, "rf-agent: the check ran over its budget of %g s: its processes were killed\n", *timeout)
		os.Exit(137)
	case code < 0:
		os.Exit(137)
	}
	os.Exit(code)
}

func writeAtomically(path, text string) {
	temp := path + ".new"
	if os.WriteFile(temp, []byte(text), 0o600) == nil {
		os.Rename(temp, path)
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
	text, err := os.ReadFile(filepath.Join(*root, *name+".pgid"))
	if err != nil {
		return // no check under way
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(text))); err == nil && pid > 1 {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

// lockSource: the source's lock file (beside its directory, never removed), held
// exclusively while a check runs; waited for up to wait (0: not at all).
func lockSource(root, name string, wait time.Duration) (*os.File, error) {
	file, err := os.OpenFile(filepath.Join(root, name+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(file.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return file, nil
		}
		if time.Now().After(deadline) {
			file.Close()
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
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
		if lock, err := lockSource(root, name, 0); err == nil {
			os.RemoveAll(filepath.Join(root, name))
			lock.Close()
		}
	}
}
