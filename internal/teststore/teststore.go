// Package teststore runs the ranks of a job as goroutines of one test
// process that meet through a rendezvous store on loopback, each rank with
// a store client of its own, as separate processes would. It is for the
// tests of the packages below the collective API (intra, inter), which
// build their groups and transports from a store themselves.
package teststore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/slimego/slimego/rendezvous"
)

// Serve starts a store with cfg on a free loopback port and returns its
// address; the store closes when the test ends.
func Serve(t testing.TB, cfg rendezvous.ServerConfig) string {
	t.Helper()
	srv, err := rendezvous.Listen("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Addr().String()
}

// Ranks runs body for ranks 0 to P-1, each in a goroutine of its own with
// a client of the store at addr, dialed under ctx and closed when body
// returns. It returns when every rank has, with each rank's error (a
// failed Dial is that rank's error); ctx bounds every wait the bodies pass
// it to.
func Ranks(ctx context.Context, addr string, P int, body func(ctx context.Context, st *rendezvous.Client, r int) error) []error {
	errs := make([]error, P)
	var wg sync.WaitGroup
	for r := range P {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := rendezvous.Dial(ctx, addr, rendezvous.Auth{})
			if err != nil {
				errs[r] = fmt.Errorf("dial the store at %s: %w", addr, err)
				return
			}
			defer st.Close()
			errs[r] = body(ctx, st, r)
		}()
	}
	wg.Wait()
	return errs
}

// Run is Ranks on a store of its own with the default configuration, which
// closes when Run returns, under a context that ends after timeout.
func Run(t testing.TB, P int, timeout time.Duration, body func(ctx context.Context, st *rendezvous.Client, r int) error) []error {
	t.Helper()
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return Ranks(ctx, srv.Addr().String(), P, body)
}
