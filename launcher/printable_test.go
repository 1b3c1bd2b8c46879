package launcher

import (
	"strings"
	"testing"
)

// TestStoreTextPrintable: what other nodes put in the store (an abort's
// reason, a node's host name) reaches this node's terminal through its
// errors; control characters (a terminal's escape sequences) are not
// passed through.
func TestStoreTextPrintable(t *testing.T) {
	const evil = "x\x1b[2J\x1b]0;title\x07y\rz"
	for _, e := range []*RemoteError{
		{Rank: 9, Node: -1, Reason: evil},
		{Rank: 1, Node: 1, Reason: evil, Interrupted: true},
		{Rank: 1, Node: 1, Reason: evil, NotStarted: true},
		{Rank: 1, Node: 1, Reason: evil},
	} {
		if s := e.Error(); strings.ContainsAny(s, "\x1b\x07\r") {
			t.Errorf("RemoteError of node %d: %q", e.Node, s)
		}
	}
	if s := (nodeInfo{Host: evil, Pid: 7, Addr: evil}).who(); strings.ContainsAny(s, "\x1b\x07\r") {
		t.Errorf("nodeInfo.who: %q", s)
	}
}
