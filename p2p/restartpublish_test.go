package p2p

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// TestPublishAfterRestart: a worker that restarts under the same name (a
// decode worker whose process crashed and was started again, or whose
// endpoint was closed and made again) publishes its new Info, and its
// peers reach the new endpoint: an Info whose endpoint is provably gone
// (on this host, its process has exited, or it is an endpoint of this
// process that was closed) no longer holds the name. An Info whose
// process still runs does (TestPublishNameTaken: an open endpoint of this
// process).
func TestPublishAfterRestart(t *testing.T) {
	addr, st := storeFor(t)
	ctx := ctxT(t, 60*time.Second)
	want := make([]byte, 64<<10)
	fill(want, 21)
	reads := func(name string) {
		t.Helper()
		c := published(t, ctx, st, "reader-"+name, nil)
		p, err := c.Connect(ctx, name)
		if err != nil {
			t.Fatalf("Connect to the restarted %q: %v", name, err)
		}
		rr, ok := p.Remote("kv")
		if !ok {
			t.Fatalf("the Info under %q is not the restarted endpoint's (no region kv)", name)
		}
		got := make([]byte, len(want))
		lr, _ := c.Register("l", got)
		if err := p.Read([]Op{{Local: lr, Remote: rr, Len: len(got)}}).Wait(ctx); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("reading the restarted %q: %v, equal %v", name, err, bytes.Equal(got, want))
		}
	}
	restarted := func(name string) {
		t.Helper()
		b := endpoint(t, ctx, Options{Name: name, Store: st, Auth: testAuth()})
		if _, err := b.Register("kv", want); err != nil {
			t.Fatal(err)
		}
		if err := b.Publish(ctx); err != nil {
			t.Fatalf("the restarted %q publishing: %v", name, err)
		}
		reads(name)
	}

	// Another process published "child" and was killed.
	cmd := startChild(t, "target", addr, 4096, 1)
	cmd.Process.Kill()
	cmd.Wait()
	restarted("child")

	// An endpoint of this process published "x" and was closed.
	a := published(t, ctx, st, "x", nil)
	a.Close()
	restarted("x")

	// A process that still runs keeps its name.
	addr2, st2 := storeFor(t)
	startChild(t, "target", addr2, 4096, 1)
	d := endpoint(t, ctx, Options{Name: "child", Store: st2, Auth: testAuth()})
	if err := d.Publish(ctx); !errors.Is(err, ErrInvalid) {
		t.Fatalf("publishing the name of a process that runs: %v, want ErrInvalid", err)
	}
}
