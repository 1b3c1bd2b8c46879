package inter

// ParseAddr checks that s, an address read from the store, is a literal
// ip:port with a port in 1–65535 (see parseAddr), for package p2p, which
// dials the addresses its peers publish under the same rule.
func ParseAddr(s string) (string, error) { return parseAddr(s) }
