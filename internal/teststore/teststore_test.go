package teststore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// TestRanksMeet: the ranks run at once, each with a store client of its
// own: every rank publishes a key and waits for every other rank's, which
// only ends if all P bodies run concurrently, and each sees its own rank.
func TestRanksMeet(t *testing.T) {
	const P = 4
	errs := Run(t, P, 20*time.Second, func(ctx context.Context, st *rendezvous.Client, r int) error {
		if err := st.Set(ctx, fmt.Sprintf("k/%d", r), []byte{byte(r)}); err != nil {
			return err
		}
		for q := range P {
			v, err := st.Get(ctx, fmt.Sprintf("k/%d", q))
			if err != nil {
				return err
			}
			if len(v) != 1 || int(v[0]) != q {
				return fmt.Errorf("key of rank %d holds %v", q, v)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestRanksDialFails: where no store listens, every rank's error is the
// failed Dial, naming the address, and body never runs.
func TestRanksDialFails(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	errs := Ranks(ctx, addr, 2, func(context.Context, *rendezvous.Client, int) error {
		return errors.New("body ran without a store")
	})
	for r, err := range errs {
		if !errors.Is(err, rendezvous.ErrUnreachable) {
			t.Errorf("rank %d: %v, want ErrUnreachable for %s", r, err, addr)
		}
	}
}

// TestServeConfig: Serve's store has the configuration given (here a key
// limit) and its address takes clients.
func TestServeConfig(t *testing.T) {
	addr := Serve(t, rendezvous.ServerConfig{MaxKeys: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := Ranks(ctx, addr, 1, func(ctx context.Context, st *rendezvous.Client, _ int) error {
		if err := st.Set(ctx, "a", nil); err != nil {
			return err
		}
		if err := st.Set(ctx, "b", nil); err == nil {
			return errors.New("a store of MaxKeys 1 took a second key")
		}
		return nil
	})
	if errs[0] != nil {
		t.Error(errs[0])
	}
}
