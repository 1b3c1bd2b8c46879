package collective

import (
	"fmt"
	"sync"

	"github.com/slimego/slimego/internal/fault"
)

// open holds the identities (Options.identity) of this process's
// communicators from Init until Close. A second Init of the same rank of
// the same job, store and name while one is open would reuse its store
// keys and shared-memory names, and meet the ranks' first communicators
// instead of their second (a rank gone, a hang until the timeout), so it
// is refused at once, before it touches the store; the open one goes on.
var open struct {
	sync.Mutex
	ids map[string]bool
}

// identity names a rank of a communicator in its store: "" for a world of
// one, whose store is its own.
func (o Options) identity() string {
	if o.WorldSize == 1 {
		return ""
	}
	return fmt.Sprintf("%s:%d %q %d %q %q %d", o.MasterAddr, o.MasterPort, o.JobID, o.Attempt, o.RunID, o.Name, o.Rank)
}

// claim records o's identity as open, or returns ErrInvalid where it
// already is.
func claim(o Options) (string, error) {
	id := o.identity()
	if id == "" {
		return "", nil
	}
	open.Lock()
	defer open.Unlock()
	if open.ids[id] {
		return "", fault.New("init", o.Rank, -1, ErrInvalid,
			"a communicator of this job is already open in this process for rank %d (name %q); Close it first, or give the second one another Options.Name", o.Rank, o.Name)
	}
	if open.ids == nil {
		open.ids = map[string]bool{}
	}
	open.ids[id] = true
	return id, nil
}

// release forgets an identity that claim returned.
func release(id string) {
	if id == "" {
		return
	}
	open.Lock()
	delete(open.ids, id)
	open.Unlock()
}
