package collective

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/slimego/slimego/internal/fault"
)

// open holds the identities (Options.identity) of this process's
// communicators from Init until Close. A second Init of the same rank of
// the same job, store and name while one is open would reuse its store
// keys and shared-memory names, and meet the ranks' first communicators
// instead of their second (a rank gone, a hang until the timeout), so it
// is refused at once, before it touches the store; the open one goes on.
// An Init after Close, or after a failed Init, is the identity's next
// generation (gens counts the ended ones, a failed Init's too, however it
// failed): its store keys and shared-memory names are its own, so that
// ranks which all close and make their communicator again (a framework
// that tears its process group down and makes it again), or all retry a
// failed Init, meet each other's new ones, not what the old ones left in
// the store. Ranks that retry must do so in step: one that retries
// several times while another waits runs ahead of it.
var open struct {
	sync.Mutex
	ids  map[string]bool
	gens map[string]int
}

// identity names a rank of a communicator in its store: "" for a world of
// one, whose store is its own.
func (o Options) identity() string {
	if o.WorldSize == 1 {
		return ""
	}
	return fmt.Sprintf("%s:%d %q %d %q %q %d", o.MasterAddr, o.MasterPort, o.JobID, o.Attempt, o.RunID, o.Name, o.Rank)
}

// claim records o's identity as open, and returns it with its generation
// (the communicators of it closed before), or returns ErrInvalid where it
// is open already.
func claim(o Options) (string, int, error) {
	id := o.identity()
	if id == "" {
		return "", 0, nil
	}
	open.Lock()
	defer open.Unlock()
	if open.ids[id] {
		return "", 0, fault.New("init", o.Rank, -1, ErrInvalid,
			"a communicator of this job is already open in this process for rank %d (name %q); Close it first, or give the second one another Options.Name", o.Rank, o.Name)
	}
	if open.ids == nil {
		open.ids, open.gens = map[string]bool{}, map[string]int{}
	}
	open.ids[id] = true
	return id, open.gens[id], nil
}

// release forgets an identity that claim returned: its next claim is the
// next generation.
func release(id string) {
	if id == "" {
		return
	}
	open.Lock()
	delete(open.ids, id)
	open.gens[id]++
	open.Unlock()
}

// scope is the name under which a communicator of name keeps its store
// keys and shared-memory names: the name itself for its first generation,
// then name.gN.
func scope(name string, gen int) string {
	if gen == 0 {
		return name
	}
	return name + ".g" + strconv.Itoa(gen)
}
