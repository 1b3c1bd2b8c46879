package p2p

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slimego/slimego/device"
	"github.com/slimego/slimego/internal/shm"
	"github.com/slimego/slimego/internal/teststore"
	"github.com/slimego/slimego/intra"
	"github.com/slimego/slimego/rendezvous"
)

// gpuErr says why the CUDA backend could not be set up (the GPU tests
// then skip).
var gpuErr error

// The test binary doubles as a peer process: with P2P_TEST_CHILD set it
// runs child instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv("P2P_TEST_CHILD") != "" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Both endpoints of most tests are in this process: their Waits read
	// their answers as Waits whose peer is another process do (a peer in
	// the same process is otherwise left to the reader goroutine); the
	// benchmarks measure what a process gets (benchPair).
	waitReadsSelf = true
	// The GPU tests run on the emulated CUDA library where there is no GPU.
	if err := device.UseEmulator(0); err != nil {
		gpuErr = err
	}
	os.Exit(m.Run())
}

// fill is the content the child's region starts with: random bytes from
// seed.
func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

// child is a target process: it registers a region "mem" of P2P_SIZE
// bytes filled from P2P_SEED, publishes its info as "child" in the store
// at P2P_STORE, prints "ready", and serves until its stdin closes (or it
// is killed). With P2P_TEST_CHILD=echo it also receives messages from
// "parent" and sends each back; with shared-target its region is Shared
// memory, with symmetric-target intra's symmetric memory (a file in
// /dev/shm) made Shared by MapShared.
func child() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch os.Getenv("P2P_TEST_CHILD") {
	case "netns-target", "netns-initiator":
		return netnsChild(ctx)
	case "gpu-export":
		return gpuExport()
	}
	st, err := rendezvous.Dial(ctx, os.Getenv("P2P_STORE"), rendezvous.Auth{Secret: []byte("s3cret"), Job: "p2p-test"})
	if err != nil {
		return err
	}
	defer st.Close()
	e, err := New(ctx, Options{Name: "child", Store: st, Auth: rendezvous.Auth{Secret: []byte("s3cret"), Job: "p2p-test"}, Heartbeat: 3 * time.Second})
	if err != nil {
		return err
	}
	// Memory freed after the endpoint's Close (deferred before it, so
	// run after it): a link may be granting it until then.
	var free []func()
	defer func() {
		for i := len(free) - 1; i >= 0; i-- {
			free[i]()
		}
	}()
	defer e.Close()
	n, _ := strconv.Atoi(os.Getenv("P2P_SIZE"))
	seed, _ := strconv.ParseUint(os.Getenv("P2P_SEED"), 10, 64)
	buf := make([]byte, n)
	var mem any = buf
	switch os.Getenv("P2P_TEST_CHILD") {
	case "shared-target":
		sh, err := NewShared(n)
		if err != nil {
			return err
		}
		buf, mem = sh.Bytes(), sh
	case "symmetric-target":
		// Symmetric memory of a group of one (a file in /dev/shm, its
		// part at an offset), made Shared by MapShared.
		g, err := intra.New(ctx, intra.Config{Store: st, Key: "p2p-sym", ShmPrefix: shm.Prefix + "p2ptest-" + strconv.Itoa(os.Getpid()) + "-", Rank: 0, Size: 1})
		if err != nil {
			return err
		}
		free = append(free, func() { g.Close() })
		b, err := g.Alloc(ctx, n)
		if err != nil {
			return err
		}
		fd, off := b.File()
		sh, err := MapShared(fd, off, n)
		if err != nil {
			return err
		}
		free = append(free, func() { sh.Close() })
		buf, mem = b.Bytes(), sh // the group's mapping of the same pages
	}
	fill(buf, seed)
	if os.Getenv("P2P_TEST_CHILD") == "gpu-target" {
		// "mem" is GPU memory, a view at an odd offset of a larger
		// allocation (an IPC grant names the allocation and the offset);
		// "host" is host memory from seed+1.
		d, err := gpuMem(n, seed)
		if err != nil {
			return err
		}
		free = append(free, func() { d.Free() })
		mem = d
		fill(buf, seed+1)
		if _, err := e.Register("host", buf); err != nil {
			return err
		}
	}
	if _, err := e.Register("mem", mem); err != nil {
		return err
	}
	if err := e.Publish(ctx); err != nil {
		return err
	}
	fmt.Println("ready")
	if os.Getenv("P2P_TEST_CHILD") == "reader" {
		// Reads the parent's region "mem" until it is killed (through a
		// lease from the second read or so on).
		p, err := e.Connect(ctx, "parent")
		if err != nil {
			return err
		}
		rr, ok := p.Remote("mem")
		if !ok {
			return fmt.Errorf("the parent publishes no region \"mem\"")
		}
		lr, err := e.Register("local", make([]byte, rr.Size))
		if err != nil {
			return err
		}
		for {
			if err := p.Read([]Op{{Local: lr, Remote: rr, Len: int(rr.Size)}}).Wait(ctx); err != nil {
				return nil // the parent went away
			}
		}
	}
	if os.Getenv("P2P_TEST_CHILD") == "echo" {
		p, err := e.Connect(ctx, "parent")
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for {
			f := p.Recv(buf)
			if err := f.Wait(ctx); err != nil {
				return nil // the parent went away
			}
			if err := p.Send(buf[:f.Len()]).Wait(ctx); err != nil {
				return nil
			}
		}
	}
	bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// gpuAlloc is the allocation gpuMem views.
var gpuAlloc *device.CUDABuffer

// gpuMem is n bytes of (emulated) GPU memory from seed, at offset 4099 of
// an allocation 8 KiB larger.
func gpuMem(n int, seed uint64) (*device.CUDABuffer, error) {
	if err := device.UseEmulator(0); err != nil {
		return nil, err
	}
	g, err := device.OpenGPU(0)
	if err != nil {
		return nil, err
	}
	a, err := g.Alloc(n + 8192)
	if err != nil {
		return nil, err
	}
	gpuAlloc = a
	d, err := a.Slice(4099, n)
	if err != nil {
		return nil, err
	}
	h := make([]byte, n)
	fill(h, seed)
	return d, d.CopyFromHost(h)
}

// gpuExport is the child that lends GPU memory to a hostile test: it
// makes P2P_SIZE bytes from P2P_SEED (gpuMem), prints "ready", the IPC
// handle of their allocation in hex and its size, and waits until its
// stdin closes.
func gpuExport() error {
	n, _ := strconv.Atoi(os.Getenv("P2P_SIZE"))
	seed, _ := strconv.ParseUint(os.Getenv("P2P_SEED"), 10, 64)
	d, err := gpuMem(n, seed)
	if err != nil {
		return err
	}
	defer gpuAlloc.Free()
	h, err := d.Dev.Lib().IPCHandle(d.Dev.Ordinal, gpuAlloc.Ptr)
	if err != nil {
		return err
	}
	fmt.Printf("ready %s %d\n", hex.EncodeToString(h[:]), gpuAlloc.Len)
	bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// startChild runs the test binary as a child of the given role whose
// region holds size bytes from seed; it returns once the child is ready,
// and kills it when the test ends.
func startChild(t *testing.T, role, store string, size int, seed uint64) *exec.Cmd {
	t.Helper()
	cmd, _ := startChildLine(t, role, store, size, seed)
	return cmd
}

// startChildLine is startChild, returning also what the child printed
// after "ready" on its first line.
func startChildLine(t *testing.T, role, store string, size int, seed uint64) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if r, ok := strings.CutSuffix(role, "+mountns"); ok { // in a mount namespace of its own (root only)
		role = r
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	cmd.Env = append(os.Environ(), "P2P_TEST_CHILD="+role, "P2P_STORE="+store,
		"P2P_SIZE="+strconv.Itoa(size), "P2P_SEED="+strconv.FormatUint(seed, 10))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		rest, ok := strings.CutPrefix(strings.TrimSpace(s), "ready")
		if !ok {
			t.Fatalf("child said %q", s)
		}
		return cmd, strings.TrimSpace(rest)
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not get ready")
	}
	return cmd, ""
}

// storeFor serves a store for the test (with the children's secret) and
// returns its address and a client.
func storeFor(t *testing.T) (string, *rendezvous.Client) {
	t.Helper()
	a := rendezvous.Auth{Secret: []byte("s3cret"), Job: "p2p-test"}
	addr := teststore.Serve(t, rendezvous.ServerConfig{Auth: a})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := rendezvous.Dial(ctx, addr, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return addr, st
}

func testAuth() rendezvous.Auth { return rendezvous.Auth{Secret: []byte("s3cret"), Job: "p2p-test"} }

// endpoint is New(ctx, o), closed when the test ends.
func endpoint(t *testing.T, ctx context.Context, o Options) *Endpoint {
	t.Helper()
	e, err := New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// published is endpoint(t, ctx, o) (o the test's options tuned) whose
// Info is in st.
func published(t *testing.T, ctx context.Context, st *rendezvous.Client, name string, tune func(*Options)) *Endpoint {
	t.Helper()
	o := Options{Name: name, Store: st, Auth: testAuth(), Heartbeat: 10 * time.Second, Timeout: 30 * time.Second}
	if tune != nil {
		tune(&o)
	}
	e := endpoint(t, ctx, o)
	if err := e.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// pair makes two endpoints in this process, "a" and "b", linked over
// loopback TCP, with the given options tuned.
func pair(t *testing.T, tune func(*Options)) (*Endpoint, *Endpoint, *Peer, *Peer) {
	t.Helper()
	_, st := storeFor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := published(t, ctx, st, "a", tune), published(t, ctx, st, "b", tune)
	ab, err := a.Connect(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	ba, err := b.Connect(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	return a, b, ab, ba
}

func rendezvous_Auth(secret string) rendezvous.Auth {
	return rendezvous.Auth{Secret: []byte(secret), Job: "p2p-test"}
}

// setLimit sets the package limit *p to v for the test, and puts the old
// value back once the test's endpoints are closed: the cleanup registered
// now runs after those registered later (the endpoints'), and after the
// test's defers, so that no endpoint goroutine reads the limit while it
// is put back.
func setLimit(t *testing.T, p *int, v int) {
	old := *p
	*p = v
	t.Cleanup(func() { *p = old })
}
