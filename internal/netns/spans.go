package netns

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// span is an inclusive range of IPv4 addresses (or ports), as numbers.
type span struct{ lo, hi uint32 }

func addrNum(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func prefixSpan(p netip.Prefix) span {
	p = p.Masked()
	lo := addrNum(p.Addr())
	return span{lo, lo | uint32(uint64(1)<<(32-p.Bits())-1)}
}

// union sorts spans and joins those that overlap or touch.
func union(ss []span) []span {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	var out []span
	for _, s := range ss {
		if n := len(out); n > 0 && (out[n-1].hi == ^uint32(0) || s.lo <= out[n-1].hi+1) {
			out[n-1].hi = max(out[n-1].hi, s.hi)
			continue
		}
		out = append(out, s)
	}
	return out
}

// subtract is from without any address of cut (both unions).
func subtract(from, cut []span) []span {
	var out []span
	for _, f := range from {
		rest := []span{f}
		for _, c := range cut {
			var next []span
			for _, r := range rest {
				if c.hi < r.lo || c.lo > r.hi {
					next = append(next, r)
					continue
				}
				if c.lo > r.lo {
					next = append(next, span{r.lo, c.lo - 1})
				}
				if c.hi < r.hi {
					next = append(next, span{c.hi + 1, r.hi})
				}
			}
			rest = next
		}
		out = append(out, rest...)
	}
	return out
}

// intervalElements encodes spans (a union) as an interval set's elements
// of width bytes (4: addresses, 2: ports), big-endian: each span's first
// value, and the value after its last as an interval end, unless the span
// runs to the last value.
func intervalElements(ss []span, width int) []nftables.SetElement {
	top := uint32(1)<<(8*width) - 1
	if width == 4 {
		top = ^uint32(0)
	}
	key := func(v uint32) []byte {
		b := binary.BigEndian.AppendUint32(nil, v)
		return b[4-width:]
	}
	var out []nftables.SetElement
	for _, s := range ss {
		out = append(out, nftables.SetElement{Key: key(s.lo)})
		if s.hi != top {
			out = append(out, nftables.SetElement{Key: key(s.hi + 1), IntervalEnd: true})
		}
	}
	return out
}
