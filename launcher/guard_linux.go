package launcher

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slimego/slimego/internal/shm"
	"github.com/slimego/slimego/rendezvous"
)

// The guard: what is left when the launcher itself is killed.
//
// A worker dies with its launcher (Pdeathsig), but its children do not: a
// launcher killed with SIGKILL (by hand, by an out-of-memory killer) can
// stop nothing, and whatever its workers started in their process groups
// (a script's background job, a data loader, a child that ignores
// SIGTERM) runs on, holding memory, ports and GPUs; so do the job's
// shared-memory segments until the next job on the host sweeps them.
//
// So each Run starts a guard: the same executable again (it runs from
// this package's init, given guardArg and guardEnv), in a process group of its
// own, ignoring the terminal's signals, that reads the launcher's list of
// worker process groups from a pipe only the launcher holds ("+PID" when
// a worker starts, "-PID" once the launcher has dealt with its group and
// is about to reap it). When the pipe ends with groups still listed, the
// launcher died without dealing with them: the guard kills what is left
// in them (SIGKILL) and sweeps the shared memory the dead job left
// (shm.SweepOrphans), then exits. After a clean end the list is empty and
// it exits at once; the launcher waits for it.
//
// On a node other than node 0, the launcher also gives its guard what it
// needs to tell the other nodes ("s": the store's address, the run, the
// node, its first rank, the job secret and the restarts allowed; "a":
// the attempt that runs), and says "e" as it ends. A guard whose pipe
// ends without "e" then aborts, in the store (where it still lists the
// launcher's claim of its node: not another run of the job started again
// at the same address), the failure prefix and the
// prefix of that attempt and of the restarts that may follow it (the
// other nodes may have started the next one meanwhile), naming the dead
// launcher, so that the other nodes stop their workers at once and end
// with an error rather than run on without this node's (and report
// success), or wait for its workers in a restart. Node 0's launcher
// serves the store itself: it dies with it, and the other nodes learn of
// that from the store.
//
// A group is signalled only while /proc shows a live member in it: the
// kernel does not give a new process the group's id while the group has
// members, and gives ids out in turn, so the id is still the job's.

// guardEnv, with guardArg as the only argument, makes a process started
// from an executable that links this package a guard, reading its list on
// stdin. Both: an environment that a program passes on to its children
// alone does not turn them into guards.
const (
	guardEnv = "SLIME_LAUNCHER_GUARD"
	guardArg = "-slimego-launcher-guard"
)

// guardGrace bounds how long a guard keeps killing what is left in the
// groups (processes that fork while being killed) before it sweeps.
const guardGrace = 5 * time.Second

func init() {
	if len(os.Args) == 2 && os.Args[1] == guardArg && os.Getenv(guardEnv) == "1" {
		os.Exit(runGuard(os.Stdin, os.Stderr))
	}
}

// guard is the launcher's end of the pipe to its guard process; a nil
// guard (none could start) does nothing.
type guard struct {
	mu  sync.Mutex
	w   *os.File
	cmd *exec.Cmd
}

// startGuard starts the guard process, or returns nil and why not. It
// runs this process's own executable file (/proc/self/exe: the file that
// was started, even if replaced or removed since). The guard says what it
// did on stderr: the launcher's console when that is a file, else this
// process's standard error.
func startGuard(stderr io.Writer) (*guard, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command("/proc/self/exe", guardArg)
	cmd.Args[0] = "slimerun-guard" // its command line in ps -ef and ps aux
	cmd.Env = append(os.Environ(), guardEnv+"=1")
	cmd.Stdin, cmd.Stderr = r, os.Stderr
	if f, ok := stderr.(*os.File); ok {
		cmd.Stderr = f
	}
	// A group of its own: a signal to the launcher's group (the
	// terminal's ^C, a kill of the group) does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	return &guard{w: w, cmd: cmd}, nil
}

// add lists worker pid's process group; drop unlists it (the launcher has
// dealt with it, and reaps the worker next).
func (g *guard) add(pid int)  { g.say('+', strconv.Itoa(pid)) }
func (g *guard) drop(pid int) { g.say('-', strconv.Itoa(pid)) }

// tellStore gives the guard what it needs to report the launcher's death
// to the other nodes through the store at addr; attempt tells it the
// attempt that runs from then on.
func (g *guard) tellStore(addr, runID string, node, rank, restarts int, secret []byte) {
	g.say('s', strings.Join([]string{addr, runID, strconv.Itoa(node), strconv.Itoa(rank), strconv.Itoa(restarts), hex.EncodeToString(secret)}, "\t"))
}
func (g *guard) attempt(n int) { g.say('a', strconv.Itoa(n)) }

// removeDir has the guard remove dir, one of the launcher's temporary
// directories (errorfile.go), once the launcher has gone: Run removes it
// itself, unless it is killed.
func (g *guard) removeDir(dir string) { g.say('d', dir) }

func (g *guard) say(op byte, arg string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w != nil {
		// A failed write (the guard is gone) leaves the job unguarded,
		// as it was before guards.
		g.w.Write(append(append([]byte{op}, arg...), '\n'))
	}
}

// close ends the list and waits for the guard to exit (at most
// guardGrace and a second: it has nothing to do after a clean end).
func (g *guard) close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.w.Write([]byte("e\n")) // a clean end: nothing to tell the other nodes
	g.w.Close()
	g.w = nil
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(guardGrace + time.Second):
		g.cmd.Process.Kill()
		<-done
	}
}

// abandon ends the list without the clean end's "e" (Run panicked): the
// guard stops what is left and tells the other nodes, as if the launcher
// had been killed. It does not wait for the guard (which takes up to
// guardGrace), only reaps it once it exits.
func (g *guard) abandon() {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.w != nil {
		g.w.Close()
		g.w = nil
	}
	g.mu.Unlock()
	go g.cmd.Wait()
}

// runGuard is the guard process: it reads the list from in until it ends,
// then cleans up after the groups still listed, telling errs what it did.
// It returns the process's exit code.
func runGuard(in io.Reader, errs io.Writer) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	// Named for ps (it would show "exe", the file it was started as).
	if name, err := unix.BytePtrFromString("slimerun-guard"); err == nil {
		unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
		runtime.KeepAlive(name)
	}
	parent := os.Getppid() // the launcher's pid, read before it dies
	var groups []int
	var dirs []string
	var rep *report
	attempt, clean := -1, false
	defer func() {
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 4096), guardLineMax) // an "s" line holds the secret
	for sc.Scan() {
		l := sc.Text()
		if l == "e" {
			clean = true
			continue
		}
		if len(l) < 2 {
			continue
		}
		if l[0] == 'd' {
			// Only a directory the launcher made (errorfile.go).
			if d := l[1:]; filepath.IsAbs(d) && strings.HasPrefix(filepath.Base(d), errorsDirPrefix) {
				dirs = append(dirs, filepath.Clean(d))
			}
			continue
		}
		switch l[0] {
		case 's':
			if r, err := parseReport(l[1:]); err == nil {
				rep = r
			}
			continue
		case 'a':
			if n, err := strconv.Atoi(l[1:]); err == nil && n >= 0 {
				attempt = n
			}
			continue
		}
		pid, err := strconv.Atoi(l[1:])
		if err != nil || pid <= 1 {
			continue
		}
		switch l[0] {
		case '+':
			if !slices.Contains(groups, pid) {
				groups = append(groups, pid)
			}
		case '-':
			groups = slices.DeleteFunc(groups, func(g int) bool { return g == pid })
		}
	}
	tell := func() {
		if !clean && rep != nil && attempt >= 0 {
			if err := rep.send(attempt, parent); err != nil {
				fmt.Fprintf(errs, "slimerun: the guard of the launcher (pid %d) could not tell the other nodes that it died: %v\n", parent, err)
			}
		}
	}
	if len(groups) == 0 {
		tell()
		return 0
	}
	killed := killGroups(groups, guardGrace)
	tell()
	removed, err := shm.SweepOrphans()
	if len(killed) > 0 || len(removed) > 0 {
		fmt.Fprintf(errs, "slimerun: the launcher (pid %d) died with its job running: killed what its workers left in their process groups and sessions %v (%d process(es)); removed %d shared-memory segment(s)\n",
			parent, groups, len(killed), len(removed))
	}
	if err != nil {
		fmt.Fprintf(errs, "slimerun: the guard of the launcher (pid %d): sweeping the job's shared memory: %v\n", parent, err)
		return 1
	}
	return 0
}

// report is what a guard needs to tell the other nodes that its launcher
// died (guard.tellStore).
type report struct {
	addr, runID          string
	node, rank, restarts int
	secret               []byte
}

// guardLineMax bounds a line of the guard's pipe: an "s" line carries the
// job secret in hex (ReadSecretFile's and the environment's limits are
// well under it).
const guardLineMax = 1 << 20

// parseReport reads a guard.tellStore line (after its 's').
func parseReport(l string) (*report, error) {
	f := strings.Split(l, "\t")
	if len(f) != 6 {
		return nil, fmt.Errorf("%d fields", len(f))
	}
	node, err1 := strconv.Atoi(f[2])
	rank, err2 := strconv.Atoi(f[3])
	restarts, err3 := strconv.Atoi(f[4])
	secret, err4 := hex.DecodeString(f[5])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	return &report{addr: f[0], runID: f[1], node: node, rank: rank, restarts: restarts, secret: secret}, nil
}

// guardAbortsMax bounds the attempts a guard's report aborts: the one
// that ran and the restarts after it, which the other nodes may have
// reached meanwhile (a store keeps 1024 aborted prefixes).
const guardAbortsMax = 16

// guardReportBound bounds a guard's report to the store, dial included.
const guardReportBound = 5 * time.Second

// send aborts the failure prefix, then the attempt's own, of the attempt
// and of the restarts that may follow it, in the store, naming the
// launcher (pid) that died, as node's first rank.
func (r *report) send(attempt, pid int) error {
	ctx, cancel := context.WithTimeout(context.Background(), guardReportBound)
	defer cancel()
	st, err := rendezvous.Dial(ctx, r.addr, rendezvous.Auth{Secret: r.secret, Job: r.runID})
	if err != nil {
		return err
	}
	defer st.Close()
	// The store may be another run's of the same job (the same address,
	// secret and run id, started again at once): only where this
	// launcher's claim of its node rank stands is the run its own.
	claim := claimKey(r.runID, r.node)
	if ok, err := st.Check(ctx, claim); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("the store at %s lists no launcher of node %d: another run of the job; not told", r.addr, r.node)
	}
	v, err := st.Get(ctx, claim)
	if err != nil {
		return err
	}
	if n, perr := parseNodeInfo(v); perr != nil || n.Pid != pid {
		return fmt.Errorf("the store at %s lists another launcher of node %d (%s): another run of the job; not told", r.addr, r.node, printable(string(v), 200))
	}
	reason := lostReason(r.node, pid)
	last := max(attempt, min(r.restarts, attempt+guardAbortsMax-1))
	for a := attempt; a <= last; a++ {
		if err := st.Abort(ctx, failedPrefix(r.runID, a), r.rank, reason); err != nil {
			return err
		}
		if err := st.Abort(ctx, rendezvous.AttemptPrefix(r.runID, a), r.rank, reason); err != nil {
			return err
		}
	}
	return nil
}

// killGroups sends SIGKILL to each of groups (the workers') that has a
// live member, and to the groups in their sessions (groupMembers), until
// none has one or grace has passed; it returns the pids it found alive.
func killGroups(groups []int, grace time.Duration) []int {
	var seen []int
	deadline := time.Now().Add(grace)
	for {
		left, all, err := groupMembers(groups, true)
		if err != nil || len(left) == 0 {
			return seen
		}
		for _, pids := range left {
			for _, p := range pids {
				if !slices.Contains(seen, p) {
					seen = append(seen, p)
				}
			}
		}
		for _, g := range all { // the workers' groups, and the groups in their sessions
			syscall.Kill(-g, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return seen
		}
		time.Sleep(20 * time.Millisecond)
	}
}
