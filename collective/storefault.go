package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slimego/slimego/internal/fault"
	"github.com/slimego/slimego/internal/netaddr"
	"github.com/slimego/slimego/rendezvous"
)

// abortInvalid starts the reason of a store abort by a rank that found
// the ranks set up apart (sameWorld), as opposed to a launcher's that saw
// a rank exit.
const abortInvalid = "invalid: "

// storeFault turns an error of the store into the error a rank reports for
// op; what says what this rank was doing ("waiting for rank 3 to join"),
// not why it failed. The store's own failures name who caused them:
//   - an abort by a rank that found the ranks set up apart is ErrInvalid
//     naming that rank, with its reason;
//   - an abort (the launcher saw a rank exit) is ErrPeerLost naming that
//     rank, or the rank it gave up on where it recorded one (blameOf);
//   - a lost connection, or an answer no call expects, is ErrPeerLost
//     naming the store's host (rank 0 when it hosts the store, none when a
//     launcher does);
//   - a refused handshake is ErrInvalid: this rank holds another secret or
//     run id than the store;
//   - anything else, ErrTimeout naming peer, the rank waited for (-1: none).
func (c *Communicator) storeFault(op string, err error, peer int, what string) error {
	o := c.opts
	var ae *rendezvous.AbortError
	switch {
	case errors.As(err, &ae) && strings.HasPrefix(ae.Reason, abortInvalid):
		// A rank found the job's ranks set up apart (sameWorld): what
		// this rank waited for will never come, and the reason says why.
		return fault.New(op, o.Rank, ae.Rank, ErrInvalid, "%s (found by rank %d, while this rank waited: %s)", ae.Reason[len(abortInvalid):], ae.Rank, what)
	case errors.As(err, &ae):
		// A rank that exited after giving up on another (a late one)
		// recorded whom it blames before it exited: that rank is the
		// cause, as the exited rank's own error says.
		if b := c.blameOf(ae.Rank); b >= 0 && b != ae.Rank && b != o.Rank {
			return fault.New(op, o.Rank, b, ErrPeerLost, "%s, having given up on rank %d (while this rank was %s)", ae.Reason, b, what)
		}
		// The reason first: what this rank waited for (another rank's
		// key, say) is not the cause, and that rank may be alive.
		return fault.New(op, o.Rank, ae.Rank, ErrPeerLost, "%s (while this rank was %s)", ae.Reason, what)
	case errors.Is(err, rendezvous.ErrConnLost):
		host, hostRank := c.storeHost()
		return fault.New(op, o.Rank, hostRank, ErrPeerLost, "%s: %s went away: %v", what, host, err)
	case errors.Is(err, rendezvous.ErrBadAnswer):
		host, hostRank := c.storeHost()
		return fault.New(op, o.Rank, hostRank, ErrPeerLost, "%s: %s answered what no call expects (a faulty store, or another version): %v", what, host, err)
	case errors.Is(err, rendezvous.ErrDenied):
		return fault.New(op, o.Rank, -1, ErrInvalid, "%s: %v (every rank needs the same SLIME_JOB_SECRET and run id)", what, err)
	case errors.Is(err, context.Canceled):
		return fault.New(op, o.Rank, peer, err, "%s", what)
	}
	return fault.New(op, o.Rank, peer, ErrTimeout, "%s: %v", what, err)
}

// storeHost says who hosts the store, for errors: its description and its
// rank (-1 for a launcher).
func (c *Communicator) storeHost() (string, int) {
	addr := net.JoinHostPort(c.opts.MasterAddr, strconv.Itoa(c.opts.MasterPort))
	if c.store != nil {
		addr = c.store.Addr()
	}
	if c.opts.AgentStore {
		return "the launcher's store at " + addr, -1
	}
	return "rank 0, which hosts the store at " + addr + ",", 0
}

// storeListenAddr is where a rank that hosts the store binds it: the
// address of SLIME_SOCKET_IFNAME's interface, or of this host that reaches
// MASTER_ADDR (loopback when the master is this host's loopback and the job
// stays on it), never every interface (netaddr.ListenIP); a world of one
// binds a free loopback port.
func storeListenAddr(o Options) (string, error) {
	if o.WorldSize == 1 {
		return "127.0.0.1:0", nil
	}
	ip, err := netaddr.ListenIP(o.SocketIfName, o.MasterAddr, o.WorldSize > o.LocalWorldSize)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(ip, strconv.Itoa(o.MasterPort)), nil
}

var warnNoSecret sync.Once

// warnIfOpen warns once per process, loudly, when a job across nodes runs
// without a secret: its store and transports then admit anyone who can
// reach them.
func warnIfOpen(o Options, store string) {
	if len(o.JobSecret) > 0 || o.WorldSize == o.LocalWorldSize {
		return
	}
	warnNoSecret.Do(func() {
		fmt.Fprintf(os.Stderr, "slimego WARNING: rank %d: this job spans nodes and has no job secret (SLIME_JOB_SECRET or SLIME_JOB_SECRET_FILE): "+
			"any process that can reach the store at %s or a rank's transport port can join the job, read its data and redirect its connections. "+
			"Give every node the same secret (slimerun --job-secret-file).\n", o.Rank, store)
	})
}

// blameOf reads the rank that rank r's failure named (failed), or -1
// where it recorded none or the store does not answer within
// blameTimeout. The key is read only once it exists (Check): a wait for
// it would outlast a rank that never wrote one.
func (c *Communicator) blameOf(r int) int {
	if c.store == nil || r < 0 || r >= c.opts.WorldSize {
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), blameTimeout)
	defer cancel()
	key := rendezvous.AttemptPrefix(c.opts.JobID, c.opts.Attempt) + "blame/" + strconv.Itoa(r)
	if ok, err := c.store.Check(ctx, key); err != nil || !ok {
		return -1
	}
	v, err := c.store.Get(ctx, key)
	if err != nil {
		return -1
	}
	b, err := strconv.Atoi(string(v))
	if err != nil || b < 0 || b >= c.opts.WorldSize {
		return -1
	}
	return b
}

// blameTimeout bounds the report of whom a failed operation names.
const blameTimeout = time.Second

// failed records, for the launcher's summary, which peer a failed
// operation names, when it names one as lost or late, and returns err. It
// runs on the error path only.
func (c *Communicator) failed(err error) error {
	var oe *fault.OpError
	if c.store == nil || !errors.As(err, &oe) || oe.Peer < 0 || oe.Peer == c.opts.Rank ||
		!(errors.Is(err, ErrTimeout) || errors.Is(err, ErrPeerLost)) {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), blameTimeout)
	defer cancel()
	key := rendezvous.AttemptPrefix(c.opts.JobID, c.opts.Attempt) + "blame/" + strconv.Itoa(c.opts.Rank)
	c.store.Set(ctx, key, []byte(strconv.Itoa(oe.Peer))) // best effort: the store may be what failed
	return err
}
