// Package verdict says how what the ranks of a job passed differs, in the
// same words on every rank: the ranks are grouped by what they passed,
// the largest group is the reference, and each other group is described
// against it. Package collective uses it for calls whose sizes differ,
// package overlap for plans whose shapes do.
package verdict

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Differs groups xs (one per rank) by same; the group that holds more
// ranks than any other is the reference (without one, rank 0's), and
// describe says how each other group differs from it (a of ranks ra
// against b of ranks rb). peer is the first rank of the first other
// group, or, on that rank (me), the reference's first rank; -1, with no
// detail, where all agree. The groups' descriptions are joined by "; ".
func Differs[T any](xs []T, me int, same func(a, b T) bool, describe func(a T, ra []int, b T, rb []int) string) (peer int, detail string) {
	var groups [][]int // ranks that passed the same, by first rank
	for r, x := range xs {
		i := slices.IndexFunc(groups, func(g []int) bool { return same(xs[g[0]], x) })
		if i < 0 {
			groups = append(groups, []int{r})
		} else {
			groups[i] = append(groups[i], r)
		}
	}
	if len(groups) < 2 {
		return -1, ""
	}
	ref := 0
	for i, g := range groups {
		if len(g) > len(groups[ref]) {
			ref = i
		}
	}
	for i, g := range groups {
		if i != ref && len(g) == len(groups[ref]) {
			ref = 0 // a tie: no majority, rank 0's is the reference
			break
		}
	}
	var parts []string
	peer = -1
	for i, g := range groups {
		if i == ref {
			continue
		}
		if peer < 0 {
			peer = g[0]
			if peer == me {
				peer = groups[ref][0]
			}
		}
		parts = append(parts, describe(xs[g[0]], g, xs[groups[ref][0]], groups[ref]))
	}
	return peer, strings.Join(parts, "; ")
}

// RankList is "rank 3", "ranks 0 and 2", "ranks 0-2, 5 and 7": sorted
// ranks, runs of three or more as ranges.
func RankList(ranks []int) string {
	var items []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if j-i >= 2 {
			items = append(items, fmt.Sprintf("%d-%d", ranks[i], ranks[j]))
			i = j + 1
			continue
		}
		items = append(items, strconv.Itoa(ranks[i]))
		i++
	}
	word := "ranks "
	if len(ranks) == 1 {
		word = "rank "
	}
	return word + AndList(items)
}

// AndList is "a", "a and b", "a, b and c".
func AndList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
