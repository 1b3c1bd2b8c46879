package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/testnetns"
)

// The test in this file runs two endpoints in network namespaces of their
// own (internal/testnetns: 192.0.2.1 and .2), and takes one's link down
// mid-transfer. It needs root and iproute2 and runs with SLIME_NETNS=1
// (make test-netns), as collective's netns tests do.

// netnsChild: "netns-target" listens on 192.0.2.2, registers "mem" (8 MiB
// of P2P_SEED's bytes), prints its Info in hex and serves until stdin
// closes. "netns-initiator" listens on 192.0.2.1 with a 1 s heartbeat,
// links with the Info in P2P_INFO, reads "mem" whole and checks it, prints
// "linked", then on a line of stdin reads in a loop until a read fails,
// and prints "failed: <error>".
func netnsChild(ctx context.Context) error {
	const size = 8 << 20
	if os.Getenv("P2P_TEST_CHILD") == "netns-target" {
		e, err := New(ctx, Options{Name: "target", ListenIP: "192.0.2.2", Auth: testAuth(), Heartbeat: time.Second})
		if err != nil {
			return err
		}
		defer e.Close()
		mem := make([]byte, size)
		fill(mem, 5)
		if _, err := e.Register("mem", mem); err != nil {
			return err
		}
		fmt.Println(hex.EncodeToString(e.Info()))
		io.Copy(io.Discard, os.Stdin)
		return nil
	}
	in, err := hex.DecodeString(os.Getenv("P2P_INFO"))
	if err != nil {
		return err
	}
	e, err := New(ctx, Options{Name: "initiator", ListenIP: "192.0.2.1", Auth: testAuth(), Heartbeat: time.Second})
	if err != nil {
		return err
	}
	defer e.Close()
	p, err := e.ConnectInfo(ctx, in)
	if err != nil {
		return err
	}
	rr, _ := p.Remote("mem")
	local := make([]byte, size)
	lr, _ := e.Register("local", local)
	want := make([]byte, size)
	fill(want, 5)
	if err := p.Read([]Op{{Local: lr, Remote: rr, Len: size}}).Wait(ctx); err != nil {
		return err
	}
	if !bytes.Equal(local, want) {
		return fmt.Errorf("the bytes read differ")
	}
	fmt.Println("linked")
	bufio.NewReader(os.Stdin).ReadString('\n')
	for {
		if err := p.Read([]Op{{Local: lr, Remote: rr, Len: size}}).Wait(ctx); err != nil {
			fmt.Println("failed:", err)
			return nil
		}
	}
}

// TestNetnsLinkDown: a link taken down mid-transfer (the peer's veth down:
// no FIN, no RST, just silence) fails the transfers within the heartbeat
// deadline with ErrTimeout.
func TestNetnsLinkDown(t *testing.T) {
	n := testnetns.Up(t, "p2p", 2)
	start := func(ns, role string, env ...string) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
		cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^$")
		cmd.Env = append(append(os.Environ(), "P2P_TEST_CHILD="+role), env...)
		cmd.Stderr = os.Stderr
		stdin, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
		return cmd, stdin, bufio.NewReader(out)
	}
	line := func(r *bufio.Reader, what string) string {
		got := make(chan string, 1)
		go func() { s, _ := r.ReadString('\n'); got <- strings.TrimSpace(s) }()
		select {
		case s := <-got:
			return s
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s within 30 s", what)
			return ""
		}
	}
	_, _, tout := start(n.NS(1), "netns-target")
	info := line(tout, "info from the target")
	_, iin, iout := start(n.NS(0), "netns-initiator", "P2P_INFO="+info)
	if s := line(iout, "link"); s != "linked" {
		t.Fatalf("the initiator said %q", s)
	}
	iin.Write([]byte("go\n"))
	time.Sleep(200 * time.Millisecond) // let reads be under way
	n.Down(t, 1)
	s := line(iout, "failure after the link went down")
	if !strings.HasPrefix(s, "failed:") || !strings.Contains(s, ErrTimeout.Error()) {
		t.Fatalf("the initiator said %q, want a timeout", s)
	}
}
