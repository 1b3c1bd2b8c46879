package intra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/rendezvous"
)

// foreignName runs local rank 1 of a group of 2 alone, against a real store
// on loopback in which the test, playing a foreign store client in rank 0's
// place, has published name as the group's segment and counted itself as
// mapped (so that rank 1 would be the last to map, and unlink). It returns
// rank 1's error from New.
func foreignName(t *testing.T, prefix, name string) error {
	t.Helper()
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	foe, err := rendezvous.Dial(ctx, srv.Addr().String(), rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	defer foe.Close()
	if err := foe.Set(ctx, "t/seg", []byte(name)); err != nil {
		t.Fatal(err)
	}
	if _, err := foe.Add(ctx, "t/seg/mapped", 1); err != nil {
		t.Fatal(err)
	}
	st, err := rendezvous.Dial(ctx, srv.Addr().String(), rendezvous.Auth{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g, err := New(ctx, Config{Store: st, Key: "t", ShmPrefix: prefix, Rank: 1, Size: 2, Timeout: 3 * time.Second})
	if err == nil {
		g.Close()
		return errors.New("New succeeded")
	}
	return err
}

// TestForeignSegmentName: a segment name or file that another store client
// planted is refused with an error naming the rank that should have
// published it, and the file it points at is neither deleted nor changed.
func TestForeignSegmentName(t *testing.T) {
	prefix := fmt.Sprintf("slimego-test-%d-hostile-", os.Getpid())
	own := prefix + "seg-"
	dir := t.TempDir()
	content := []byte("precious data, not a slimego segment\n")
	victimIn := func(d, base string) string {
		p := filepath.Join(d, base)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
		return p
	}
	cases := []struct {
		name  string
		setup func() (published, victim string)
	}{
		{"traversal", func() (string, string) {
			v := victimIn(dir, "victim")
			return "../.." + v, v
		}},
		{"absolute", func() (string, string) {
			v := victimIn(dir, "victim-abs")
			return v, v
		}},
		{"prefixed traversal", func() (string, string) {
			v := victimIn(dir, "victim-pt")
			return own + "x/../../.." + v, v
		}},
		{"symlink", func() (string, string) {
			v := victimIn(dir, "victim-link")
			n := own + "o1.1-link"
			p := filepath.Join("/dev/shm", n)
			if err := os.Symlink(v, p); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(p) })
			return n, v
		}},
		{"foreign header", func() (string, string) {
			lay, _ := newLayout(2, DefaultSlots, DefaultSlotBytes)
			n := own + "o1.1-foreign"
			p := filepath.Join("/dev/shm", n)
			if err := os.WriteFile(p, bytes.Repeat([]byte{0xa5}, lay.total), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(p) })
			content = bytes.Repeat([]byte{0xa5}, lay.total)
			return n, p
		}},
		{"other job's header", func() (string, string) {
			lay, _ := newLayout(2, DefaultSlots, DefaultSlotBytes)
			n := own + "o1.1-otherjob"
			p := filepath.Join("/dev/shm", n)
			mem := make([]byte, lay.total)
			lay.writeIdentity(mem, jobHash("slimego-someone-else-"))
			if err := os.WriteFile(p, mem, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(p) })
			content = mem
			return n, p
		}},
		{"wrong size", func() (string, string) {
			n := own + "o1.1-small"
			p := filepath.Join("/dev/shm", n)
			content = []byte("a small file with the right prefix\n")
			if err := os.WriteFile(p, content, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(p) })
			return n, p
		}},
		{"bad characters", func() (string, string) {
			v := victimIn(dir, "victim-chars")
			return own + "a\x00b", v
		}},
		{"too long", func() (string, string) {
			v := victimIn(dir, "victim-long")
			return own + strings.Repeat("a", 256), v
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			content = []byte("precious data, not a slimego segment\n")
			published, victim := c.setup()
			want := bytes.Clone(content)
			start := time.Now()
			err := foreignName(t, prefix, published)
			if time.Since(start) > 20*time.Second {
				t.Errorf("took %v to refuse", time.Since(start))
			}
			var oe *fault.OpError
			if !errors.As(err, &oe) || oe.Op != "init" || oe.Rank != 1 || oe.Peer != 0 {
				t.Errorf("want an init error on rank 1 about rank 0, got %v", err)
			} else if !errors.Is(err, fault.ErrInvalid) {
				t.Errorf("want ErrInvalid, got %v", err)
			} else {
				t.Logf("rank 1: %v", err)
			}
			got, rerr := os.ReadFile(victim)
			if rerr != nil {
				t.Fatalf("victim %s: %v", victim, rerr)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("victim %s changed", victim)
			}
		})
	}
}
