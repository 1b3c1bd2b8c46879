package p2p_test

import (
	"context"
	"fmt"
	"time"

	"github.com/slimego/slimego/p2p"
	"github.com/slimego/slimego/rendezvous"
)

// Two endpoints, a prefill and a decode worker (here in one process, on
// loopback), linked out of band through the decode side's Info: the
// prefill side writes two pages into the decode side's registered cache
// with one batched WriteWithImm, and the decode side takes the immediate,
// which arrives after the bytes.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	auth := rendezvous.Auth{Secret: []byte("the job's secret"), Job: "example"}
	newEndpoint := func(name string) *p2p.Endpoint {
		e, err := p2p.New(ctx, p2p.Options{Name: name, Auth: auth, ListenIP: "127.0.0.1"})
		if err != nil {
			panic(err)
		}
		return e
	}
	decode, prefill := newEndpoint("decode0"), newEndpoint("prefill0")
	defer decode.Close()
	defer prefill.Close()

	// The decode side registers its KV cache: 4 pages of 4 KiB.
	const page = 4096
	cache := make([]byte, 4*page)
	if _, err := decode.Register("kv", cache); err != nil {
		panic(err)
	}

	// The prefill side links to it with its Info (bytes, handed over out
	// of band; Publish and Connect do it through the store), and finds
	// the cache among the regions the Info lists.
	peer, err := prefill.ConnectInfo(ctx, decode.Info())
	if err != nil {
		panic(err)
	}
	kv, _ := peer.Remote("kv")
	pages := make([]byte, 2*page)
	for i := range pages {
		pages[i] = byte(1 + i/page) // page 1, then page 2
	}
	src, err := prefill.Register("stage", pages)
	if err != nil {
		panic(err)
	}
	// Its two pages into the cache's slots 3 and 0, then immediate 7.
	f := peer.WriteWithImm([]p2p.Op{
		{Local: src, LocalOff: 0, Remote: kv, RemoteOff: 3 * page, Len: page},
		{Local: src, LocalOff: page, Remote: kv, RemoteOff: 0, Len: page},
	}, 7)
	if err := f.Wait(ctx); err != nil {
		panic(err)
	}

	im, err := decode.Imm(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("immediate %d from %s; slots hold pages %d, %d, %d, %d\n",
		im.Value, im.Peer, cache[0], cache[page], cache[2*page], cache[3*page])
	// Output:
	// immediate 7 from prefill0; slots hold pages 2, 0, 0, 1
}
